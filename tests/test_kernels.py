"""The CPU fast paths: the oneDNN path of VaswaniLinear (float32) — the formula and its gradients, the same
training step and the same decoding as the plain nn.Linear path, packed weights kept only while they are valid —
and the eager product in decoding steps, which gives what SDPA gives; freed memory kept for reuse."""

import subprocess
import sys

import pytest
import torch

from conftest import random_ids, tiny_model
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from vaswani_hf import modeling_vaswani
from vaswani_hf.modeling_vaswani import KEPT_PACKED_WEIGHTS, VaswaniLinear, onednn_linear_applies, packed_weights


@pytest.mark.parametrize("bias", [True, False])
def test_the_onednn_linear_layer_computes_the_formula_and_its_gradients(bias):
    torch.manual_seed(0)
    layer = VaswaniLinear(24, 40, bias=bias)
    x = torch.randn(7, 5, 24).transpose(0, 1).requires_grad_()  # (5, 7, 24), not contiguous
    assert onednn_linear_applies(x, layer.weight)
    y = layer(x)
    assert "OneDNNLinearFunction" in y.grad_fn.name()
    grad = torch.randn_like(y)
    y.backward(grad)

    x64, w64, g64 = x.detach().double(), layer.weight.detach().double(), grad.double()
    expected = x64 @ w64.T + (layer.bias.detach().double() if bias else 0)
    torch.testing.assert_close(y.double(), expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x.grad.double(), g64 @ w64, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(layer.weight.grad.double(), g64.flatten(0, 1).T @ x64.flatten(0, 1), rtol=1e-5, atol=1e-5)
    if bias:
        torch.testing.assert_close(layer.bias.grad.double(), g64.sum((0, 1)), rtol=1e-5, atol=1e-5)


def gradients(monkeypatch, use_onednn: bool) -> dict[str, torch.Tensor]:
    monkeypatch.setattr(VaswaniLinear, "use_onednn", use_onednn)
    model = tiny_model(seed=4).train()
    model(input_ids=random_ids(4, 9, seed=1), labels=random_ids(4, 6, seed=2)).loss.backward()
    return {name: parameter.grad for name, parameter in model.named_parameters()}


def test_a_training_step_has_the_gradients_of_the_plain_path(monkeypatch):
    onednn, plain = gradients(monkeypatch, True), gradients(monkeypatch, False)
    assert onednn.keys() == plain.keys()
    for name in plain:
        torch.testing.assert_close(onednn[name], plain[name], rtol=1e-4, atol=1e-6, msg=name)


def decode(model, source, monkeypatch, use_onednn: bool, **kwargs):
    """generate() with the oneDNN path on or off; checks that the output projection multiplied by a packed weight
    exactly when the path is on."""
    monkeypatch.setattr(VaswaniLinear, "use_onednn", use_onednn)
    packed_during_call = []
    hook = model.lm_head.register_forward_hook(
        lambda module, args, output: packed_during_call.append("packed_weight" in vars(module))
    )
    try:
        output = model.generate(source, max_new_tokens=10, output_scores=True, return_dict_in_generate=True, **kwargs)
    finally:
        hook.remove()
    assert packed_during_call and set(packed_during_call) == {use_onednn}
    return output


@pytest.mark.parametrize("num_beams", [1, 4])
def test_decoding_with_packed_weights_is_decoding_with_the_plain_path(monkeypatch, num_beams):
    model, source = tiny_model(seed=5), random_ids(3, 8, seed=3)
    fast = decode(model, source, monkeypatch, True, num_beams=num_beams)
    plain = decode(model, source, monkeypatch, False, num_beams=num_beams)
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


def test_packed_weights_are_kept_between_calls_in_eval_mode_and_never_go_stale(monkeypatch):
    model, source = tiny_model(seed=6), random_ids(3, 8, seed=4)
    decode(model, source, monkeypatch, True)
    assert not any("packed_weight" in vars(module) for module in model.modules())  # only during a call
    kept = KEPT_PACKED_WEIGHTS[model.lm_head][3]
    decode(model, source, monkeypatch, True)
    assert KEPT_PACKED_WEIGHTS[model.lm_head][3] is kept  # packed once for both calls

    with torch.no_grad():  # change the weights in place between two calls: the second must use the new ones
        for module in model.modules():
            if isinstance(module, VaswaniLinear):
                module.weight.mul_(-1.5)
    fast = decode(model, source, monkeypatch, True)
    assert KEPT_PACKED_WEIGHTS[model.lm_head][3] is not kept
    plain = decode(model, source, monkeypatch, False)
    assert torch.equal(fast.sequences, plain.sequences)
    torch.testing.assert_close(torch.stack(fast.scores), torch.stack(plain.scores), rtol=1e-5, atol=1e-5)


def test_packed_weight_blocks_nest():
    """A decoding loop inside another (the GNMT search inside generate(), inside the translator) leaves the outer
    block's packed weights in place when it ends."""
    model = tiny_model(seed=6)
    with packed_weights(model):
        outer = model.lm_head.packed_weight
        with packed_weights(model):
            assert model.lm_head.packed_weight is outer
        assert model.lm_head.packed_weight is outer
    assert "packed_weight" not in vars(model.lm_head)


@pytest.mark.parametrize("release", [lambda model: model.train(), lambda model: model.double().float()],
                         ids=["train()", "a dtype round trip"])
def test_kept_packed_weights_are_freed_by_training_mode_and_by_new_weights(monkeypatch, release):
    model = tiny_model(seed=6)
    decode(model, random_ids(3, 8, seed=4), monkeypatch, True)
    linear_layers = [module for module in model.modules() if isinstance(module, VaswaniLinear)]
    assert all(module in KEPT_PACKED_WEIGHTS for module in linear_layers)
    release(model)
    assert not any(module in KEPT_PACKED_WEIGHTS for module in linear_layers)


def test_generate_in_training_mode_keeps_no_packed_weights(monkeypatch):
    model = tiny_model(seed=6).train()
    decode(model, random_ids(3, 8, seed=4), monkeypatch, True)
    assert not any(module in KEPT_PACKED_WEIGHTS for module in model.modules())


@pytest.mark.parametrize("num_beams", [1, 4])
def test_decoding_steps_take_the_eager_product_and_give_what_sdpa_gives(monkeypatch, num_beams):
    """With the "sdpa" kernel, the encoder runs SDPA and every decoding step on the CPU the eager product; the
    sequences and scores are those of SDPA throughout."""
    model, source = tiny_model(seed=7), random_ids(3, 8, seed=5)
    assert model.config._attn_implementation == "sdpa"
    calls = []

    def counting(name, kernel):
        def counted(*args, **kwargs):
            calls.append(name)
            return kernel(*args, **kwargs)
        return counted

    monkeypatch.setitem(ALL_ATTENTION_FUNCTIONS, "sdpa", counting("sdpa", ALL_ATTENTION_FUNCTIONS["sdpa"]))
    monkeypatch.setattr(modeling_vaswani, "eager_attention_forward",
                        counting("eager", modeling_vaswani.eager_attention_forward))
    outputs = {}
    for rows in (16, 0):
        monkeypatch.setattr(modeling_vaswani, "EAGER_QUERY_ROWS_ON_CPU", rows)
        calls.clear()
        outputs[rows] = model.generate(source, num_beams=num_beams, max_new_tokens=10, output_scores=True,
                                       return_dict_in_generate=True)
        encoder_calls = calls[: model.config.num_layers]
        decoder_calls = calls[model.config.num_layers:]
        assert encoder_calls == ["sdpa"] * model.config.num_layers
        assert set(decoder_calls) == {"eager" if rows else "sdpa"}
    assert torch.equal(outputs[16].sequences, outputs[0].sequences)
    torch.testing.assert_close(torch.stack(outputs[16].scores), torch.stack(outputs[0].scores), rtol=1e-5, atol=1e-5)


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
    result = subprocess.run([sys.executable, "-c", REFAULT_PROBE], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    default, applied, kept = result.stdout.split()
    assert applied == "True"  # Linux with glibc, as the machines that run these tests
    assert int(default) > 1000 and int(kept) * 100 < int(default), (default, kept)
