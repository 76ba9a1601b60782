"""One optimizer step's forward and backward over this process's batches (§5.1, §5.4), at the pace of the device.

- On one process nothing in the step waits for the device: the step's target tokens are counted from the token
  lists, and the loss comes back as a tensor that training/run.py reads every `--logging_steps`. On a GPU the host
  meanwhile reads and pads the next step's batches: they are ready when the GPU is. (Several processes add up their
  token counts first: one wait a step.)
- `--compile BACKEND` runs the model and the loss through `torch.compile` (inductor on a GPU by default, eager on a
  CPU: `compile_backend`), their sizes symbolic from the first compile (`dynamic=True`: a run's batches differ in
  rows and lengths, and compiling for each shape would recompile until dynamo gives up), each size a symbol of its
  own and each Python float a constant (`tracing_options`); a run compiles each once, which `compilations()`
  counts. Compiled, the loss is training/loss.py's `plain_label_smoothed_nll`, which the compiler fuses; eager,
  `label_smoothed_nll`'s blocks.
  The loss's graph takes the vocabulary's size as a constant (it never changes): with a symbol there, the loss's
  kernels may find a logit's row by dividing its index by a number read at run time.
- Largest batches (`--max_tokens 0` on a GPU, `fewest_batches`): an optimizer step in as few batches as the GPU's
  memory holds, found by trial steps at the sizes that would divide the step evenly.
- Attention kernels on a GPU (`attention_kernels`): SDPA chooses among flash, memory-efficient and math kernels, not
  cuDNN's unless `--cudnn_attention`. On Hopper GPUs torch prefers cuDNN's, and cuDNN builds an execution plan on the
  host for each new problem shape (rows, lengths), while a run's batches change shape at every step.
- Attention on a CPU under bfloat16 autocast (`--mixed_precision bf16`; run_trainer.py's `--bf16 true`;
  `training_config`): transformers' eager attention, whose products autocast makes bfloat16. The fused kernel SDPA
  takes there (flash attention for the CPU) took 15x float32's time for its backward in bfloat16, which made the
  whole step slower than float32's (Intel Xeon, family 6, model 167, with AMX: benchmarks/README.md, session 116).
- `--deterministic` (`deterministic_kernels`): only kernels whose result does not depend on the order in which
  threads finish. Without it a GPU run adds some sums with atomics (memory-efficient attention's backward over split
  keys; the embedding's gradient in a compiled step), so the same command and seed need not give the same weights
  there; a CPU run in eager mode gives them either way.
"""

import contextlib
import copy
import functools
import math
import os

import torch
from accelerate.utils import broadcast_object_list
from torch._inductor import config as inductor_config
from torch.nn.attention import SDPBackend, sdpa_kernel

from training.distributed import gradient_sync, unwrap
from training.fsdp_request import launcher_backend
from training.loss import label_smoothed_nll, plain_label_smoothed_nll
from vaswani_hf.modeling_vaswani import shift_tokens_right

MEMORY_SHARE = 0.9  # of the GPU's memory, for the trial step's peak and Adam's two moments


class TrainingStep:
    """`step(inputs, local_tokens)`: forward and backward over the step's batches of this process (`inputs`, from
    training/batching.py `collate`), which hold `local_tokens` target tokens. §5.1/§5.4: the label-smoothed loss is
    summed over the step's target tokens on every process and divided by their number; returns that loss, a tensor
    on the device, and the number. The forward builds no decoding cache (`use_cache=False`, as labels would ask):
    one would copy each layer's keys and values."""

    def __init__(self, accelerator, model, label_smoothing: float, backend: str | None = None,
                 cudnn_attention: bool = False):
        self.accelerator, self.model, self.label_smoothing = accelerator, model, label_smoothing
        self.kernels = functools.partial(attention_kernels, accelerator.device, cudnn_attention)
        self.forward = torch.compile(model, backend=backend, dynamic=True) if backend else model
        self.loss = torch.compile(plain_label_smoothed_nll, backend=backend, dynamic=True) if backend else \
            label_smoothed_nll
        self.symbols = tracing_options if backend else contextlib.nullcontext
        self.graphs = compiled_graphs()  # dynamo's count is per process: this step's are those compiled after

    def __call__(self, inputs: list[dict], local_tokens: int) -> tuple[torch.Tensor, int]:
        accelerator, config = self.accelerator, unwrap(self.model).config
        step_tokens = local_tokens if accelerator.num_processes == 1 else int(accelerator.reduce(
            torch.tensor(local_tokens, device=accelerator.device), "sum").item())
        step_loss = torch.zeros((), device=accelerator.device)
        for a, batch in enumerate(inputs):
            with (gradient_sync(accelerator, self.model, a == len(inputs) - 1), accelerator.autocast(),
                  self.kernels(), self.symbols()):
                decoder_input_ids = shift_tokens_right(batch["labels"], config.pad_token_id,
                                                       config.decoder_start_token_id)
                logits = self.forward(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                      decoder_input_ids=decoder_input_ids, use_cache=False).logits
                if self.forward is not self.model:
                    torch._dynamo.mark_static(logits, logits.dim() - 1)  # the vocabulary: module docstring
                loss_sum, _, _ = self.loss(logits, batch["labels"], self.label_smoothing)
                # DDP and FSDP average gradients over processes: scale so the step's sum is divided by its tokens.
                accelerator.backward(loss_sum * accelerator.num_processes / step_tokens)
            step_loss += loss_sum.detach()
        return accelerator.reduce(step_loss, "sum") / step_tokens, step_tokens

    def compilations(self) -> int:
        """Graphs compiled for this step so far, the model's and the loss's (0 uncompiled)."""
        return compiled_graphs() - self.graphs if self.forward is not self.model else 0


BFLOAT16_CPU = ("avx512_bf16", "amx_bf16", "bf16", "sve_bf16")  # torch.cpu.get_capabilities()'s: x86, then Arm


def slow_bfloat16() -> bool:
    """Whether this CPU lacks bfloat16 instructions: there bfloat16 autocast took 10x float32's step (an AMD EPYC,
    family 23), which the entry points warn of."""
    return not any(map(torch.cpu.get_capabilities().get, BFLOAT16_CPU))


def training_config(config, device: torch.device, mixed_precision: str):
    """The config of the model that a run trains: the run's `config`, or on a CPU under bfloat16 autocast a copy
    with transformers' eager attention (module docstring). The run's other models (the final average, evaluated
    copies of a sharded model) are built from `config` and keep its attention."""
    if device.type != "cpu" or mixed_precision != "bf16":
        return config
    eager = copy.deepcopy(config)
    eager._attn_implementation = "eager"
    return eager


def deterministic_kernels() -> None:
    """For the rest of the process, kernels that give the same result from run to run (module docstring): torch's
    deterministic algorithms (memory-efficient attention's backward without split keys, index sums sorted instead of
    added atomically, in eager and in inductor's code), cuBLAS with a fixed workspace (read when cuBLAS starts: call
    this before the first product on a GPU), and inductor without kernels chosen by timing them."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    inductor_config.deterministic = True


def compile_backend(choice: str, device: torch.device, dropout_changes: bool = False) -> str | None:
    """The torch.compile backend of `--compile` `choice`, or None for eager: auto is the launcher's
    (`launcher_backend`), else inductor on a GPU (measured the faster there, benchmarks/README.md), unless P_drop
    changes from step to step (`--dropout_epochs`: each value would compile again), and eager on a CPU."""
    if choice == "auto":
        return launcher_backend() or ("inductor" if device.type == "cuda" and not dropout_changes else None)
    return None if choice == "no" else choice


def attention_kernels(device: torch.device, cudnn: bool = False):
    """A block in which SDPA on a GPU may choose any of its kernels but cuDNN's (module docstring); with `cudnn`, or
    off a GPU, torch's choice as it stands."""
    if cudnn or device.type != "cuda":
        return contextlib.nullcontext()
    return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])


@contextlib.contextmanager
def tracing_options():
    """A block in which torch.compile traces the step once for a whole run. Each input size is a symbol of its own: by
    default sizes equal when it first traces share one ("duck sizing"), so a run whose first batch had sources and
    targets of one width compiled again at the first batch where they differ. Each Python float is a constant:
    `dynamic=True` traces floats as symbols, and the embeddings' `norm_type`, which torch's embedding reads as a
    number, made dynamo trace the whole model a second time (benchmarks/README.md, session 96)."""
    with torch.fx.experimental._config.patch(use_duck_shape=False), torch._dynamo.config.patch(specialize_float=True):
        yield


class Diverged(ValueError):
    """A run whose weights are lost: a step's loss or gradient norm that is not finite (its update makes the weights
    NaN; under fp16 the loss scaler skips that step instead), or weights that are not."""


def read_values(entries: list[dict], finite: bool = False) -> None:
    """The losses and gradient norms that steps left on the device in these history entries, as floats, read with
    one wait for the device; empties `entries`. `finite`: a value that is not is a Diverged (under fp16 the loss
    scaler skips a step that overflows, and the run goes on)."""
    pending = [(entry, key) for entry in entries for key in ("loss", "grad_norm") if key in entry]
    if pending:
        values = torch.stack([entry[key] for entry, key in pending]).tolist()
        for (entry, key), value in zip(pending, values):
            entry[key] = value
    entries.clear()
    for entry, key in pending if finite else []:
        if not math.isfinite(entry[key]):
            name = key.replace("_", " ")
            raise Diverged(f"the {name} is {entry[key]} at step {entry['step']}: the run has diverged, its weights "
                           "are lost from that step on (a lower --lr_scale may keep it finite)")


def check_finite_weights(model, step: int) -> None:
    """A Diverged unless every weight of `model` is finite (one wait for the device)."""
    if not torch.stack([weight.isfinite().all() for weight in model.parameters()]).all():
        raise Diverged(f"the weights are not finite after step {step}: the run has diverged (a lower --lr_scale or "
                       "--learning_rate may keep them finite)")


def compiled_graphs() -> int:
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"]


def fewest_batches(tokens_per_step: int, fits, most: int = 64) -> int:
    """The largest batch, in tokens, that divides an optimizer step of `tokens_per_step` evenly into k <= `most`
    batches (ceil(tokens_per_step / k)) and for which `fits(tokens)` holds: bisection over k, so `fits` is tried
    about log2(most) + 1 times (it must hold for every size below one it holds for)."""
    size = lambda k: math.ceil(tokens_per_step / k)
    if not fits(size(most)):
        raise SystemExit(f"error: not even a batch of {size(most)} tokens fits this device's memory: give "
                         "--max_tokens below it, or a smaller model")
    low, high = 1, most  # fits(size(high)) holds
    while low < high:
        middle = (low + high) // 2
        low, high = (low, middle) if fits(size(middle)) else (middle + 1, high)
    return size(high)


def largest_batch(accelerator, model, tokens_per_step: int, max_length: int, cudnn_attention: bool = False) -> int:
    """Every process calls this before the model is prepared. The main process's GPU's largest batch for this model
    (`fewest_batches`, with trial steps at `max_length`, the widest pairs a run batches, with the run's attention
    kernels), shared with every process so that all batch alike."""
    found = [0]
    if accelerator.is_main_process:
        model.to(accelerator.device)
        kernels = attention_kernels(accelerator.device, cudnn_attention)
        with torch.random.fork_rng(devices=[accelerator.device]), kernels:  # trial dropout: the run's draws stay
            found[0] = fewest_batches(tokens_per_step, lambda tokens: trial_fits(accelerator, model, tokens,
                                                                                  max_length))
    return broadcast_object_list(found)[0]


def trial_fits(accelerator, model, tokens: int, length: int) -> bool:
    """Whether a training step's forward and backward of `tokens` source and target tokens (rows of `length`), with
    Adam's two float32 moments beside, keeps within MEMORY_SHARE of the GPU's memory."""
    device = accelerator.device
    ids = torch.full((max(1, tokens // length), length), model.config.eos_token_id, device=device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    try:
        with accelerator.autocast():
            logits = model(input_ids=ids, decoder_input_ids=ids, use_cache=False).logits
            label_smoothed_nll(logits, ids)[0].backward()
        del logits
        moments = 2 * sum(parameter.numel() * 4 for parameter in model.parameters())
        return torch.cuda.max_memory_allocated(device) + moments <= MEMORY_SHARE * torch.cuda.mem_get_info(device)[1]
    except torch.OutOfMemoryError:
        return False
    finally:
        model.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()
