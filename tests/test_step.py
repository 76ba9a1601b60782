"""training/step.py: the largest batch (the fewest batches an optimizer step can be made of), bucketed widths, and a
step that reads nothing from the device."""

import contextlib
import math
import os
from types import SimpleNamespace

import pytest
import torch

from training.step import Diverged, fewest_batches, read_values


@pytest.mark.parametrize("limit", [25000, 24999, 12500, 9000, 4096, 391])
def test_the_batch_is_the_largest_even_share_of_the_step_that_fits(limit):
    """Against the definition: the largest ceil(25,000 / k) at most `limit`, found in O(log 64) trials."""
    tried = []

    def fits(tokens):
        tried.append(tokens)
        return tokens <= limit

    expected = max(math.ceil(25000 / k) for k in range(1, 65) if math.ceil(25000 / k) <= limit)
    assert fewest_batches(25000, fits) == expected
    assert len(tried) <= 7


def test_a_step_of_which_not_even_a_64th_fits_is_a_one_line_error():
    with pytest.raises(SystemExit, match="^error: not even a batch of 391 tokens fits this device's memory"):
        fewest_batches(25000, lambda tokens: tokens < 391)


def step_of(model, batch, tokens: int):
    """run.py's step (one process, eager) over one batch of `tokens` target tokens: its loss tensor and the
    gradients it left."""
    from accelerate import Accelerator
    from support import accelerate_as_in_a_new_process

    from training.step import TrainingStep

    with accelerate_as_in_a_new_process():
        loss, _ = TrainingStep(Accelerator(cpu=True), model, 0.1)([batch], tokens)
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss, gradients


SOURCES, TARGETS = [[5, 6, 7, 8, 9, 2], [10, 11, 2], [12, 2]], [[13, 14, 2], [15, 16, 17, 18, 2], [19, 2]]


def test_widths_padded_to_a_multiple_give_the_same_loss_and_gradients():
    """--pad_to_multiple_of 8 (bucketed widths, for compiled steps): the padding is masked in the encoder, in the
    encoder-decoder attention and in the loss, so the step is the one padded to the longest pair."""
    from support import tiny_model

    from training.batching import collate

    model = tiny_model().train()
    exact = collate(range(3), SOURCES, TARGETS, 0, "cpu")
    bucketed = collate(range(3), SOURCES, TARGETS, 0, "cpu", multiple=8)
    assert exact["input_ids"].shape == (3, 6) and bucketed["input_ids"].shape == bucketed["labels"].shape == (3, 8)
    loss, gradients = step_of(model, exact, 10)
    loss_bucketed, gradients_bucketed = step_of(model, bucketed, 10)
    torch.testing.assert_close(loss_bucketed, loss)
    for name, gradient in gradients.items():
        torch.testing.assert_close(gradients_bucketed[name], gradient, msg=name)


@pytest.mark.parametrize("epsilon", [0.1, 0.25])
def test_a_step_of_several_batches_divides_its_smoothed_loss_sum_by_all_its_target_tokens(epsilon, monkeypatch):
    """§5.1, §5.4: an optimizer step is a set of pairs, however it is cut into batches. Over two batches of 2 and 8
    target tokens, the step's loss and gradients are those of the formula written out: the cross-entropy against the
    smoothed distribution (gold 1 - ε, every other token ε / (V - 1)), summed over the 10 tokens, divided by 10. The
    gradients are reduced over processes after the step's last batch alone."""
    from accelerate import Accelerator
    from support import accelerate_as_in_a_new_process, tiny_model

    import training.step
    from training.batching import collate
    from training.step import TrainingStep

    synced, gradient_sync = [], training.step.gradient_sync

    def recorded(accelerator, model, sync):
        synced.append(sync)
        return gradient_sync(accelerator, model, sync)

    monkeypatch.setattr(training.step, "gradient_sync", recorded)
    model = tiny_model()
    batches = [collate(pairs, SOURCES, TARGETS, 0, "cpu") for pairs in ([2], [0, 1])]
    assert [int(batch["labels"].ne(-100).sum()) for batch in batches] == [2, 8]
    with accelerate_as_in_a_new_process():
        loss, _ = TrainingStep(Accelerator(cpu=True), model, epsilon)(batches, 10)
    assert synced == [False, True]
    gradients = {name: parameter.grad.clone() for name, parameter in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    total = 0.0
    for batch in batches:
        log_probs = model(**batch).logits.log_softmax(-1)  # the model shifts the labels into its decoder inputs
        vocab = log_probs.shape[-1]
        gold = batch["labels"].clamp(min=0)
        smoothed = torch.full_like(log_probs, epsilon / (vocab - 1)).scatter(-1, gold[..., None], 1 - epsilon)
        total = total + (-(smoothed * log_probs).sum(-1) * batch["labels"].ne(-100)).sum()
    (total / 10).backward()
    torch.testing.assert_close(loss, total.detach() / 10)
    for name, parameter in model.named_parameters():
        torch.testing.assert_close(gradients[name], parameter.grad, msg=name)


class StandIn(torch.nn.Module):
    """A model that reads nothing to the host: logits from the decoder inputs' embeddings."""

    def __init__(self):
        from support import tiny_config

        super().__init__()
        self.config = tiny_config()
        self.embed = torch.nn.Embedding(self.config.vocab_size, self.config.vocab_size)

    def forward(self, input_ids, attention_mask, decoder_input_ids, use_cache):
        return SimpleNamespace(logits=self.embed(decoder_input_ids))


def test_the_step_reads_nothing_from_the_device_of_its_own():
    """The loss comes back as a tensor and the step adds no read to the host (`.item()`, which on a GPU waits for
    it) to the model's own: run.py reads the losses every --logging_steps. Counted at torch's dispatcher, where
    `.item()` runs as `_local_scalar_dense`, around a model that reads nothing. (The model's eager forward reads
    its ids and masks; compiled, it does not: benchmarks/utilisation.py counts a GPU's waits in a step.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    from training.batching import collate

    class Reads(TorchDispatchMode):
        count = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Reads.count += func is torch.ops.aten._local_scalar_dense.default
            return func(*args, **(kwargs or {}))

    batch = collate(range(3), SOURCES, TARGETS, 0, "cpu")
    with Reads():
        loss, gradients = step_of(StandIn(), batch, 10)
    assert isinstance(loss, torch.Tensor) and loss.dim() == 0 and Reads.count == 0
    assert gradients["embed.weight"].abs().sum() > 0


def cudnn_flags() -> tuple[bool, ...]:
    """Which of SDPA's GPU kernels may run now: cuDNN's, flash, memory-efficient, math."""
    backends = torch.backends.cuda
    return (backends.cudnn_sdp_enabled(), backends.flash_sdp_enabled(), backends.mem_efficient_sdp_enabled(),
            backends.math_sdp_enabled())


def test_on_a_gpu_the_step_trains_without_cudnns_attention_unless_asked(monkeypatch):
    """cuDNN builds a plan for each new shape, and a run's batches change shape at every step: on a GPU the step's
    forward and backward run with SDPA's other kernels, and torch's choice is back after it. The step is taken on
    the CPU with the device the kernels are chosen for said to be a GPU (torch's flags need none)."""
    import training.step
    from training.batching import collate

    chosen_for = training.step.attention_kernels
    monkeypatch.setattr(training.step, "attention_kernels",
                        lambda device, cudnn=False: chosen_for(torch.device("cuda"), cudnn))
    seen = []

    class Recording(StandIn):
        def forward(self, **inputs):
            output = super().forward(**inputs)
            seen.append(("forward", cudnn_flags()))
            output.logits.register_hook(lambda gradient: seen.append(("backward", cudnn_flags())))
            return output

    batch = collate(range(3), SOURCES, TARGETS, 0, "cpu")
    assert cudnn_flags() == (True, True, True, True)  # torch's defaults
    step_of(Recording(), batch, 10)
    assert seen == [("forward", (False, True, True, True)), ("backward", (False, True, True, True))]
    assert cudnn_flags() == (True, True, True, True)
    seen.clear()
    monkeypatch.setattr(training.step, "attention_kernels",
                        lambda device, cudnn=False: chosen_for(torch.device("cuda"), True))  # --cudnn_attention
    step_of(Recording(), batch, 10)
    assert seen == [("forward", (True, True, True, True)), ("backward", (True, True, True, True))]
    assert isinstance(chosen_for(torch.device("cpu")), contextlib.nullcontext)  # off a GPU: torch's choice


def compiled_steps(backend, pairs) -> int:
    """run.py's step compiled by `backend` (one process, a fresh dynamo: other tests' compiled forwards count toward
    its limits) over one batch of each (sources, targets) in `pairs`; the graphs it compiled."""
    from accelerate import Accelerator
    from support import accelerate_as_in_a_new_process, tiny_model

    from training.batching import collate
    from training.step import TrainingStep

    torch._dynamo.reset()
    model = tiny_model(num_layers=1, num_decoder_layers=1).train()
    with accelerate_as_in_a_new_process():
        step = TrainingStep(Accelerator(cpu=True), model, 0.1, backend=backend)
        for sources, targets in pairs:
            batch = collate(range(len(sources)), sources, targets, 0, "cpu")
            step([batch], int(batch["labels"].ne(-100).sum()))
            model.zero_grad(set_to_none=True)
        return step.compilations()


def test_a_compiled_step_whose_first_batch_has_one_width_on_both_sides_compiles_once():
    """Dynamo gives sizes equal at its first trace one symbol ("duck sizing"): a first batch whose sources and
    targets have one width would make the first batch where they differ compile a second graph (a base step compiles
    for about a minute on a GPU). The step gives each size a symbol of its own: one graph for batches of any widths,
    the model's, and one for the loss."""
    pairs = [(SOURCES, [t + [20] * (len(s) - len(t)) for s, t in zip(SOURCES, TARGETS)]), (SOURCES, TARGETS),
             (SOURCES[1:], TARGETS[:2])]
    assert compiled_steps("eager", pairs) == 2  # dynamo alone


def test_a_compiled_step_is_traced_once_its_loss_with_the_vocabulary_as_a_constant_and_the_sizes_as_symbols():
    """In the loss's graph the logits' rows and lengths are symbols (any batch, one graph) and the vocabulary's size a
    number: with a symbol, the loss's kernels may find a logit's row by dividing by a value read at run time (a
    GPU's 925 million logits a step). What dynamo hands the compiler, read off the graph's inputs, then compiled by
    aot_eager: AOTAutograd traces each graph once. (`dynamic=True` traces Python floats as symbols unless told; the
    embeddings' `norm_type`, which torch's embedding reads as a number, then stopped AOTAutograd, and dynamo traced
    the whole model again.)"""
    from support import tiny_model
    from torch._dynamo.backends.debugging import aot_eager
    from torch._dynamo.utils import counters

    shapes = []  # each graph's inputs' sizes, as dynamo traced them

    def recording(graph, inputs):
        shapes.append({node.name: tuple(node.meta["example_value"].shape) for node in graph.graph.nodes
                       if node.op == "placeholder" and isinstance(node.meta.get("example_value"), torch.Tensor)})
        return aot_eager(graph, inputs)

    traced = counters["aot_autograd"]["total"]  # dynamo's counts are per process: this step's are the growth
    assert compiled_steps(recording, [(SOURCES, TARGETS), (SOURCES[1:], TARGETS[:2])]) == 2
    assert counters["aot_autograd"]["total"] - traced == 2
    (logits,) = [sizes for graph in shapes for name, sizes in graph.items() if "logits" in name]
    rows, length, vocabulary = logits
    assert isinstance(rows, torch.SymInt) and isinstance(length, torch.SymInt)
    assert type(vocabulary) is int and vocabulary == tiny_model().config.vocab_size


def test_a_cpu_run_under_bf16_alone_trains_a_copy_of_its_config_with_eager_attention():
    """training_config: on a CPU under bfloat16 autocast, a copy with transformers' eager attention (the run's other
    models keep the config's); on a GPU, or without bf16, the config itself."""
    from support import tiny_config

    from training.step import training_config

    config = tiny_config()
    eager = training_config(config, torch.device("cpu"), "bf16")
    assert eager._attn_implementation == "eager" and config._attn_implementation != "eager"
    assert eager.to_dict() | {"_attn_implementation": None} == config.to_dict() | {"_attn_implementation": None}
    for device, precision in (("cuda", "bf16"), ("cpu", "no"), ("cpu", "fp16")):
        assert training_config(config, torch.device(device), precision) is config


def test_deterministic_kernels_turn_on_torchs_inductors_and_cublass_determinism(monkeypatch):
    from torch._inductor import config as inductor_config

    from training.step import deterministic_kernels

    asked = []
    monkeypatch.setattr(torch, "use_deterministic_algorithms", asked.append)
    monkeypatch.setattr(inductor_config, "deterministic", False)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    deterministic_kernels()
    assert asked == [True] and inductor_config.deterministic is True
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_compile_auto_is_inductor_on_a_gpu_and_eager_on_a_cpu():
    """--compile auto (the default): inductor on a GPU, where it measured the faster; eager on a CPU, and eager when
    --dropout_epochs changes P_drop at every step; a backend named is taken as it is."""
    from training.step import compile_backend

    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert compile_backend("auto", gpu) == "inductor" and compile_backend("auto", cpu) is None
    assert compile_backend("auto", gpu, dropout_changes=True) is None
    assert compile_backend("no", gpu) is None and compile_backend("aot_eager", cpu) == "aot_eager"


def test_mixed_precision_keeps_the_logits_dtype_and_trains_as_accelerates_float32_outputs():
    """Under bf16 mixed precision Accelerate converts the forward's outputs to float32 (a copy of the whole logits);
    `prepare` keeps its autocast and drops the copy. The logits stay bfloat16, also outside `accelerator.autocast()`,
    and a step's loss and gradients are those of the model as Accelerate prepares it, bit for bit (bfloat16 to
    float32 is exact, and the loss converts what it reads)."""
    from accelerate import Accelerator
    from support import accelerate_as_in_a_new_process, tiny_model

    from training.batching import collate
    from training.distributed import prepare
    from training.schedule import paper_optimizer
    from training.step import TrainingStep

    batch = collate(range(3), SOURCES, TARGETS, 0, "cpu")
    ours, accelerates = tiny_model().train(), tiny_model().train()
    accelerates.load_state_dict(ours.state_dict())
    with accelerate_as_in_a_new_process():
        accelerator = Accelerator(cpu=True, mixed_precision="bf16")
        ours = prepare(accelerator, ours, lambda m: paper_optimizer(m, 24))[0]
        accelerates = accelerator.prepare(accelerates)
        source = batch["input_ids"]
        assert ours(input_ids=source, decoder_input_ids=source, use_cache=False).logits.dtype == torch.bfloat16
        assert accelerates(input_ids=source, decoder_input_ids=source, use_cache=False).logits.dtype == torch.float32
        losses = [TrainingStep(accelerator, model, 0.1)([batch], 10)[0] for model in (ours, accelerates)]
    assert torch.equal(*losses)
    for (name, parameter), other in zip(ours.named_parameters(), accelerates.parameters()):
        assert torch.equal(parameter.grad, other.grad), name


def test_mixed_precision_keeps_the_logits_dtype_of_a_forward_set_on_the_model_as_a_function():
    """A forward that is the model's own attribute, not a method (Accelerate then wraps it as a plain function): kept
    as a plain function, it still returns bfloat16 logits."""
    import functools

    from accelerate import Accelerator
    from support import accelerate_as_in_a_new_process, tiny_model

    from training.distributed import keep_output_dtype

    model = tiny_model()
    model.forward = functools.partial(type(model).forward, model)
    source = torch.tensor([[5, 6, 2]])
    with accelerate_as_in_a_new_process():
        model = Accelerator(cpu=True, mixed_precision="bf16").prepare(model)
        assert model(input_ids=source, decoder_input_ids=source).logits.dtype == torch.float32  # Accelerate's copy
        keep_output_dtype(model)
        assert model(input_ids=source, decoder_input_ids=source).logits.dtype == torch.bfloat16


def test_reading_a_gradient_norm_or_loss_that_is_not_finite_is_a_divergence_unless_fp16_lets_the_run_go_on():
    """read_values reads the values in one go, each entry's in place; with `finite` (every precision but fp16, whose
    loss scaler skips a step that overflows) the first loss or gradient norm that is not finite stops the run."""
    def entries():
        return [{"step": 1, "loss": torch.tensor(6.0), "grad_norm": torch.tensor(3.0)},
                {"step": 2, "loss": torch.tensor(5.5), "grad_norm": torch.tensor(float("inf"))},
                {"step": 3, "loss": torch.tensor(float("nan"))}]

    read = entries()
    read_values(list(read))
    assert [entry["loss"] for entry in read][:2] == [6.0, 5.5] and read[1]["grad_norm"] == float("inf")
    with pytest.raises(Diverged, match=r"^the grad norm is inf at step 2: the run has diverged"):
        read_values(entries(), finite=True)
