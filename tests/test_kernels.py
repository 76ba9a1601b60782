"""The CPU kernels chosen by measurement (vaswani_hf/kernels.py), which `fast_cpu(model)` applies to a model object:
every candidate computes the formula; the chooser keeps the faster of two kernels of known cost; training is torch's,
bit for bit; whatever it chooses, decoding gives what the plain path gives; packed weights are used only while valid;
the plain model never touches them; the attention kernel the user names is the one that runs; freed memory kept for
reuse."""

import json
import os
import subprocess
import sys
import time
import weakref
from pathlib import Path

import pytest
import torch
from conftest import random_ids, tiny_model
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from vaswani_hf import fast_cpu, modeling_vaswani
from vaswani_hf.kernels import KERNELS, MEASURED_ATTENTION, Kernels, VaswaniLinear, fastest


@pytest.fixture
def kernels(monkeypatch):
    """KERNELS with nothing chosen, forced, frozen or packed (other tests' models may be alive), restored after."""
    monkeypatch.setattr(KERNELS, "chosen", {})
    monkeypatch.setattr(KERNELS, "packed", weakref.WeakKeyDictionary())
    monkeypatch.setattr(KERNELS, "forced", ())
    monkeypatch.setattr(KERNELS, "frozen", False)
    return KERNELS


@pytest.mark.parametrize("forced", [[], ["onednn"]])
def test_training_products_are_torchs_and_never_measured(kernels, forced):
    """With gradient a transformed layer is `nn.Linear`, whatever is forced: nothing timed, nothing chosen, the same
    outputs and gradients bit for bit (a run's weights cannot depend on how busy the machine is)."""
    kernels.force(*forced)
    torch.manual_seed(0)
    plain = torch.nn.Linear(24, 40)
    layer = VaswaniLinear(24, 40)
    layer.load_state_dict(plain.state_dict())
    x = torch.randn(7, 5, 24).transpose(0, 1).requires_grad_()  # (5, 7, 24), not contiguous
    outputs = []
    for module in (plain, layer):
        y = module(x)
        y.backward(torch.ones_like(y))
        outputs.append((y, x.grad.clone(), module.weight.grad, module.bias.grad))
        x.grad = None
    assert kernels.chosen == {}
    for ours, torchs in zip(*outputs):
        assert torch.equal(ours, torchs)


@pytest.mark.parametrize("kernel", ["torch", "onednn", "onednn_packed"])
def test_each_decoding_kernel_computes_the_formula(kernels, kernel):
    kernels.force(kernel)
    torch.manual_seed(0)
    layer = VaswaniLinear(24, 40).eval()
    x = torch.randn(4, 1, 24)
    with torch.no_grad(), kernels.decoding():
        y = layer(x)
    assert (layer in kernels.packed) == (kernel == "onednn_packed")  # the packed weight was what multiplied
    expected = x.double() @ layer.weight.detach().double().T + layer.bias.detach().double()
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


@pytest.mark.parametrize("order", [("slow", "fast"), ("fast", "slow")])
def test_the_chooser_keeps_the_faster_of_two_kernels_and_measures_each_shape_class_once(order):
    costs = {"slow": 2e-3, "fast": 2e-4}
    calls = []

    def run(name):
        calls.append(name)
        busy(costs[name])

    chooser = Kernels()
    assert chooser.choose(("forward", 3), order, run) == "fast"
    measured = len(calls)
    assert measured >= 6 and calls.count("slow") == calls.count("fast")  # a warm-up and at least 2 rounds each
    assert chooser.choose(("forward", 3), order, run) == "fast" and len(calls) == measured  # kept, not measured again
    chooser.choose(("forward", 4), order, run)
    assert len(calls) > measured  # another shape class is measured on its own
    assert chooser.summary() == {"forward": {"fast": 2}}
    chooser.forced = ("slow",)  # what force() sets, for kernel names of this test
    assert chooser.choose(("forward", 3), order, run) == "slow"


def test_every_product_is_measured_per_number_of_tokens(kernels):
    """Shape classes: kind of product × weight shape × tokens rounded up to a power of two."""
    layer = VaswaniLinear(24, 40).eval()
    with torch.no_grad():
        for tokens in (3, 300):
            layer(torch.randn(tokens, 24))
            with kernels.decoding():
                layer(torch.randn(tokens, 24))
    classes = {(key[0], key[1]) for key in kernels.chosen}
    assert classes == {(kind, bits) for kind in ("inference", "decoding") for bits in (2, 9)}


def test_the_chooser_judges_each_kernel_by_its_best_call():
    """One interrupted call (the faster kernel's first timed call, 30 times its cost) does not decide."""
    durations = {"a": iter([1e-4, 3e-3]), "b": iter([])}  # a's warm-up, then the interrupted call

    def run(name):
        busy(next(durations[name], 1e-4 if name == "a" else 5e-4))

    assert fastest(("a", "b"), run) == "a"


def test_choices_round_trip_as_json_on_the_same_cpu_only():
    chooser = Kernels()
    chooser.chosen = {("forward", 9, (40, 24), True): "onednn", ("attention", 7, 4, 1, 3, 64, True): "eager"}
    state = json.loads(json.dumps(chooser.state_dict()))
    again = Kernels()
    assert again.load_state_dict(state) and again.chosen == chooser.chosen
    assert not Kernels().load_state_dict({**state, "cpu": "another CPU"})


def test_frozen_choices_extend_to_new_sizes_without_measuring():
    """After freeze(), a class met for the first time takes the choice of the nearest class in size that differs
    in nothing else; only a class with no such neighbour is measured."""
    chooser = Kernels()
    chooser.chosen = {("forward", 4, (40, 24), True): "torch", ("forward", 9, (40, 24), True): "onednn"}
    chooser.freeze()
    never = lambda name: pytest.fail("measured")
    assert chooser.choose(("forward", 5, (40, 24), True), ("torch", "onednn"), never) == "torch"
    assert chooser.choose(("forward", 12, (40, 24), True), ("torch", "onednn"), never) == "onednn"
    measured = []
    chooser.choose(("forward", 5, (40, 99), True), ("torch", "onednn"), measured.append)
    assert measured  # another weight shape: no neighbour


def test_forcing_an_unknown_kernel_is_a_one_line_error():
    with pytest.raises(ValueError, match="unknown kernel 'onedn' \\(VASWANI_KERNELS\\): choose among torch, onednn"):
        Kernels().force("onedn")


def test_the_environment_variable_forces_the_kernels_of_a_fresh_process():
    probe = ("from conftest import tiny_model, random_ids\n"
             "from vaswani_hf.kernels import KERNELS\n"
             "from vaswani_hf import fast_cpu\n"
             "model = fast_cpu(tiny_model())\n"
             "model.generate(random_ids(2, 5), max_new_tokens=3)\n"
             "model.train()(input_ids=random_ids(2, 5), labels=random_ids(2, 4)).loss.backward()\n"
             "print(KERNELS.forced, KERNELS.chosen)\n")
    result = subprocess.run([sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "VASWANI_KERNELS": "torch,eager"}, cwd=Path(__file__).parent)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split("\n")[0] == "('torch', 'eager') {}"  # nothing measured: every choice was forced


# --- the transform ------------------------------------------------------------------------------------------------

def test_the_plain_model_runs_torchs_layers_and_never_measures(kernels):
    """What travels to the Hub: nn.Linear and transformers' SDPA; nothing measured, nothing packed."""
    model, source = tiny_model(seed=8), random_ids(3, 8, seed=6)
    assert {type(module) for module in model.modules() if isinstance(module, torch.nn.Linear)} == {torch.nn.Linear}
    model.generate(source, num_beams=4, max_new_tokens=4)
    model.train()(input_ids=source, labels=source).loss.backward()
    assert kernels.chosen == {} and len(kernels.packed) == 0 and "generate" not in vars(model)


def test_fast_cpu_changes_the_kernels_not_the_weights_and_twice_is_once(kernels):
    model = tiny_model(seed=8)
    weights = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    linear = sum(isinstance(module, torch.nn.Linear) for module in model.modules())
    assert fast_cpu(fast_cpu(model)) is model
    assert sum(type(module) is VaswaniLinear for module in model.modules()) == linear
    assert all(torch.equal(tensor, weights[name]) for name, tensor in model.state_dict().items())
    assert model.generate.__self__ is model and model._inner_generate.__func__ is type(model).generate


def test_a_deep_copy_of_a_transformed_model_decodes_with_its_own_weights(kernels):
    """quantize_int8 deep-copies: the copy's generate() must run the copy, not the original."""
    import copy

    model, source = fast_cpu(tiny_model(seed=8)), random_ids(3, 8, seed=6)
    twin = copy.deepcopy(model)
    with torch.no_grad():
        twin.lm_head.weight.mul_(-1)  # the copy now prefers other tokens
    assert not torch.equal(twin.generate(source, max_new_tokens=4), model.generate(source, max_new_tokens=4))
    assert twin.generate.__self__ is twin and twin._inner_generate.__self__ is twin


def test_the_translator_transforms_its_model_on_a_cpu_unless_told_not_to(translation_folder):
    from vaswani_hf.translate import load

    fast, _ = load(str(translation_folder), "cpu")
    plain, _ = load(str(translation_folder), "cpu", fast=False)  # vaswani-translate --no_fast_cpu
    linear = torch.nn.Linear
    assert {type(module) for module in fast.modules() if isinstance(module, linear)} == {VaswaniLinear}
    assert {type(module) for module in plain.modules() if isinstance(module, linear)} == {linear}
    assert (fast.config._attn_implementation, plain.config._attn_implementation) == (MEASURED_ATTENTION, "sdpa")


# --- whatever is chosen, the model computes the same ---------------------------------------------------------------

def test_a_transformed_model_trains_as_the_plain_one_bit_for_bit(kernels):
    """A training step of the transformed model (kernels forced or left to measurement) is the plain model's."""
    source, labels = random_ids(4, 9, seed=1), random_ids(4, 6, seed=2)
    gradients = []
    for transform, forced in ((lambda m: m, ()), (fast_cpu, ("onednn", "eager")), (fast_cpu, ())):
        KERNELS.force(*forced)
        model = transform(tiny_model(seed=4)).train()
        torch.manual_seed(0)  # the same dropout masks
        model(input_ids=source, labels=labels).loss.backward()
        gradients.append({name: parameter.grad for name, parameter in model.named_parameters()})
    for other in gradients[1:]:
        assert other.keys() == gradients[0].keys()
        assert all(torch.equal(other[name], gradients[0][name]) for name in other)


def decode(model, source, *kernels, **kwargs):
    KERNELS.force(*kernels)
    return model.generate(source, max_new_tokens=10, output_scores=True, return_dict_in_generate=True, **kwargs)


@pytest.mark.parametrize("num_beams", [1, 4])
def test_decoding_gives_the_same_sequences_and_scores_whichever_kernels_run(kernels, num_beams):
    model, source = fast_cpu(tiny_model(seed=5)), random_ids(3, 8, seed=3)
    plain = decode(model, source, "torch", "sdpa", num_beams=num_beams)
    for forced in [("onednn", "eager"), ("onednn_packed", "eager"), ("onednn_packed", "sdpa"), ()]:
        other = decode(model, source, *forced, num_beams=num_beams)
        assert torch.equal(other.sequences, plain.sequences), forced
        torch.testing.assert_close(torch.stack(other.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


# --- packed weights ----------------------------------------------------------------------------------------------

def test_a_weight_fingerprint_samples_inside_the_weight_at_every_size():
    """The base model's output projection (37000 x 512) is where float32 sample positions ran past the end."""
    from vaswani_hf.kernels import fingerprint

    for shape in [(1,), (3, 5), (37000, 512), (64,), (65,)]:
        weight = torch.arange(torch.Size(shape).numel(), dtype=torch.float64).reshape(shape)  # exact indices
        samples = fingerprint(weight)[2]
        assert samples[0] == 0 and samples[-1] == weight.numel() - 1 and len(samples) == min(64, weight.numel())


def test_packed_weights_are_kept_between_calls_in_eval_mode_and_never_go_stale(kernels):
    model, source = fast_cpu(tiny_model(seed=6)), random_ids(3, 8, seed=4)
    decode(model, source, "onednn_packed")
    kept = kernels.packed[model.lm_head][3]
    decode(model, source, "onednn_packed")
    assert kernels.packed[model.lm_head][3] is kept  # packed once for both calls

    with torch.no_grad():  # change the weights in place between two calls: the second must use the new ones
        for module in model.modules():
            if isinstance(module, VaswaniLinear):
                module.weight.mul_(-1.5)
    fast = decode(model, source, "onednn_packed")
    assert kernels.packed[model.lm_head][3] is not kept
    plain = decode(model, source, "torch")
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


def test_a_fused_adam_step_between_two_calls_in_eval_mode_is_seen(kernels):
    """torch's fused Adam changes the weights in place without counting a version: a kept packed copy must not
    survive it, even with the model left in eval mode (no training forward to free the copies)."""
    model, source = fast_cpu(tiny_model(seed=6)), random_ids(3, 8, seed=4)
    model.eval()
    decode(model, source, "onednn_packed")
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05, fused=True)
    version = model.lm_head.weight._version
    model(input_ids=source, labels=source).loss.backward()
    optimizer.step()
    assert model.lm_head.weight._version == version  # the premise: the update went uncounted
    fast = decode(model, source, "onednn_packed")
    plain = decode(model, source, "torch")
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


def test_a_training_forward_frees_the_packed_weights_and_a_generate_in_training_mode_keeps_none(kernels):
    model, source = fast_cpu(tiny_model(seed=6)), random_ids(3, 8, seed=4)
    decode(model, source, "onednn_packed")
    linear_layers = [module for module in model.modules() if isinstance(module, VaswaniLinear)]
    assert all(module in kernels.packed for module in linear_layers)
    model.train()(input_ids=source, labels=source)
    assert not any(module in kernels.packed for module in linear_layers)
    decode(model, source, "onednn_packed")  # in training mode
    assert not any(module in kernels.packed for module in linear_layers)


def test_decoding_blocks_nest(kernels):
    """A decoding loop inside another (the GNMT search inside the translator) leaves the outer block open."""
    with kernels.decoding():
        with kernels.decoding():
            assert kernels.open_decoding_blocks == 2
        assert kernels.open_decoding_blocks == 1
    assert kernels.open_decoding_blocks == 0


# --- attention ---------------------------------------------------------------------------------------------------

def counting(calls, name, kernel):
    def counted(*args, **kwargs):
        calls.append(name)
        return kernel(*args, **kwargs)
    return counted


@pytest.mark.parametrize("requested", ["sdpa", "eager"])
def test_the_attention_kernel_the_user_names_is_the_one_that_runs(kernels, monkeypatch, requested):
    model, source = tiny_model(seed=7, attn_implementation=requested), random_ids(3, 8, seed=5)
    assert model.config._attn_implementation == requested
    calls = []
    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", counting(calls, "sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"]))
    monkeypatch.setattr(modeling_vaswani, "eager_attention_forward",
                        counting(calls, "eager", modeling_vaswani.eager_attention_forward))
    model.generate(source, num_beams=4, max_new_tokens=5)
    assert calls and set(calls) == {requested}


def test_the_measured_attention_kernel_gives_what_sdpa_gives(kernels):
    model, source = tiny_model(seed=7), random_ids(3, 8, seed=5)
    assert model.config._attn_implementation == "sdpa"  # transformers' default
    sdpa = decode(model, source, num_beams=4)
    fast_cpu(model)
    assert model.config._attn_implementation == MEASURED_ATTENTION
    measured = decode(model, source, num_beams=4)
    assert "attention" in kernels.summary()  # SDPA measured against the eager product at the decoding steps' shapes
    assert torch.equal(measured.sequences, sdpa.sequences)
    torch.testing.assert_close(torch.stack(measured.scores), torch.stack(sdpa.scores), rtol=1e-5, atol=1e-5)


# Pages faulted in by a 64 MiB tensor allocated and written right after an equal one was freed, before and after
# keep_freed_memory() (a fresh process: the setting is for the whole process).
REFAULT_PROBE = """
import resource, torch
from vaswani_hf import keep_freed_memory

def refaults():
    torch.ones(16 << 20)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 << 20)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

default = refaults()
applied = keep_freed_memory()
refaults()  # the heap grows once
print(default, applied, refaults())
"""


def test_keep_freed_memory_lets_a_freed_block_be_reused_without_faulting_its_pages_in_again():
    result = subprocess.run([sys.executable, "-c", REFAULT_PROBE], check=False, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    default, applied, kept = result.stdout.split()
    assert applied == "True"  # Linux with glibc, as the machines that run these tests
    assert int(default) > 1000 and int(kept) * 100 < int(default), (default, kept)
