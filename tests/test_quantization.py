"""The int8 inference copy (vaswani_hf.speed.quantization): every linear layer quantized, the float32 model untouched,
logits close to the float32 model's, and the translator's --int8 flag."""

import copy
import shutil

import pytest
import torch
from support import random_ids, run_without, tiny_config, tiny_model
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from vaswani_hf import VaswaniForConditionalGeneration, fast_cpu, quantize_int8
from vaswani_hf.speed.kernels import PackedLinear
from vaswani_hf.speed.quantization import Int8Linear, full_range_activations
from vaswani_hf.tools.translate import main as translate


def test_the_int8_copy_quantizes_every_linear_layer_and_leaves_the_model_alone():
    plan = {"greedy": {"packed": True}, "beam": {"shared": True, "packed": True}, "training": {"onednn": False}}
    model = fast_cpu(tiny_model(), plan).train()  # a transformed model whose plan packs: its layers are PackedLinear
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    linear_names = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    quantized = quantize_int8(model)
    quantized_names = {name for name, layer in quantized.named_modules() if isinstance(layer, DynamicQuantizedLinear)}
    assert quantized_names == linear_names
    assert "lm_head" in linear_names
    assert len(linear_names) == 2 * (4 + 2) + 3 * (4 + 4 + 2) + 1  # attention, FFN, output
    assert all(type(module) is PackedLinear for name, module in model.named_modules() if name in linear_names)
    assert all(torch.equal(tensor, before[name]) for name, tensor in model.state_dict().items())
    assert model.training and not quantized.training


def test_int8_logits_follow_the_float32_logits():
    model = tiny_model(seed=3).eval()
    source, target = random_ids(4, 9, seed=1), random_ids(4, 7, seed=2)
    with torch.no_grad():
        reference = model(input_ids=source, decoder_input_ids=target).logits
        int8 = quantize_int8(model)(input_ids=source, decoder_input_ids=target).logits
    relative_error = (int8 - reference).norm() / reference.norm()
    assert relative_error < 0.03, relative_error
    assert (int8.argmax(-1) == reference.argmax(-1)).float().mean() > 0.9


def test_activations_get_8_bits_where_the_cpu_has_vnni_and_never_saturate():
    """The worst case for the products: every activation and every weight at the top of its range. With 8-bit
    activations and fbgemm's 16-bit pair sums (no VNNI) the result would be about half of the right one."""
    model = tiny_model()
    quantized = quantize_int8(model)
    layers = [module for module in quantized.modules() if isinstance(module, DynamicQuantizedLinear)]
    assert {type(module) for module in layers} == {Int8Linear if full_range_activations() else DynamicQuantizedLinear}

    linear = nn.Linear(512, 4, bias=False)
    with torch.no_grad():
        linear.weight.fill_(1.0)
        linear.weight[1] = -1.0
    layer = quantize_int8(nn.Sequential(linear))[0]
    x = torch.ones(3, 512)
    x[:, 0] = 0.0  # activations in [0, 1]: all but one at the top of the range
    with torch.no_grad():
        torch.testing.assert_close(layer(x), linear(x), rtol=0.01, atol=0.0)


def test_the_int8_layers_compute_with_8_bit_activations_and_err_less_than_torchs_7_bit_ones():
    """`Int8Linear` against the formula: activations rounded to 255 levels of their range (torch's layer: 127),
    weights to their per-channel int8, products exact; and what the 8th bit buys on a ReLU output (the input of the
    FFN's second layer) against the float32 product. Every other input is zero, so that no pair of 8-bit products
    can saturate fbgemm's 16-bit sums on a CPU without VNNI: the layer computes exactly on any CPU, though
    quantize_int8 uses it only where the CPU has VNNI."""
    torch.manual_seed(0)
    linear = nn.Linear(256, 256)
    x = torch.relu(torch.randn(64, 256))  # FFN-like: non-negative, skewed
    x[:, 1::2] = 0.0
    torchs = torch.ao.quantization.quantize_dynamic(
        nn.Sequential(linear), {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8
    )[0]
    ours = copy.deepcopy(torchs)
    ours.__class__ = Int8Linear
    weight = torchs.weight()
    weight = weight.int_repr().double() * weight.q_per_channel_scales().double()[:, None]

    def quantized_product(levels: int) -> torch.Tensor:
        step = x.max().double() / levels
        return (torch.round(x.double() / step) * step) @ weight.T + linear.bias.double()

    with torch.no_grad():
        reference = linear(x)
        for layer, levels in ((ours, 255), (torchs, 127)):
            expected = quantized_product(levels)
            assert (layer(x).double() - expected).abs().max() < 1e-5 * expected.abs().max(), levels
        ours_error, torchs_error = ((layer(x) - reference).norm() / reference.norm() for layer in (ours, torchs))
    assert ours_error < torchs_error, (ours_error, torchs_error)


def test_each_output_channel_gets_its_own_scale():
    """Per-channel weights, as the module docstring says: an output whose weights are a thousandth of another's keeps
    its precision (with one scale for the whole matrix, its weights would all round to zero)."""
    torch.manual_seed(0)
    linear = nn.Linear(64, 2, bias=False)
    with torch.no_grad():
        linear.weight[0] *= 1e-3
    layer = quantize_int8(nn.Sequential(linear))[0]
    x = torch.randn(16, 64)
    with torch.no_grad():
        small, expected = layer(x)[:, 0], linear(x)[:, 0]
    assert (small - expected).norm() < 0.02 * expected.norm(), (small, expected)


def test_a_model_off_the_cpu_is_refused_with_what_to_do():
    with pytest.raises(ValueError, match=r"runs on the CPU: move the model there first \(model.cpu\(\)\)"):
        quantize_int8(tiny_model().to("meta"))


def test_a_torch_that_cannot_tell_vnni_gets_torchs_7_bit_activations(monkeypatch):
    """Without torch's VNNI probe, full-range activations are not assumed: on a CPU without VNNI they saturate."""
    assert full_range_activations() == torch.cpu._is_vnni_supported()
    monkeypatch.delattr(torch.cpu, "_is_vnni_supported")
    assert full_range_activations() is False
    layers = [layer for layer in quantize_int8(tiny_model()).modules() if isinstance(layer, DynamicQuantizedLinear)]
    assert layers and all(type(layer) is DynamicQuantizedLinear for layer in layers)


def test_without_torchs_legacy_quantization_the_package_works_and_int8_is_refused(tmp_path, monkeypatch, capsys,
                                                                                 translation_folder):
    """torch deprecates `torch.ao.quantization` and its dynamic int8 layers for torchao, and means to remove them.
    In a fresh Python whose torch has neither (taken out after `import torch`), the package imports, a model decodes
    under `fast_cpu` as in this process, and `quantize_int8` and `vaswani-translate --int8` say in one line what is
    missing and what does the same (CTranslate2's int8, which translates there as here), before any weights are
    read."""
    script = """
        import sys, torch
        legacy = ("torch.ao.nn.quantized", "torch.ao.quantization")
        for name in [name for name in sys.modules if name.startswith(legacy)]:
            sys.modules[name] = None  # importing one now fails, as if torch had none
        del torch.ao.nn.quantized, torch.ao.quantization
        import vaswani_hf
        from vaswani_hf.speed.decoding import PLAIN
        from vaswani_hf.tools.translate import main
        config = vaswani_hf.VaswaniConfig(vocab_size=53, d_model=24, d_ff=36, num_heads=3, num_layers=2,
                                          num_decoder_layers=3, dropout=0.0)  # tiny_config()'s
        torch.manual_seed(0)
        model = vaswani_hf.fast_cpu(vaswani_hf.VaswaniForConditionalGeneration(config).eval(), PLAIN)
        print(model.generate(torch.arange(3, 12).view(1, 9), num_beams=4, max_new_tokens=6).tolist())
        try:
            vaswani_hf.quantize_int8(model)
        except RuntimeError as error:
            print(error)
        main(["--model", sys.argv[3], "--engine", "ctranslate2", "--int8", "--input", sys.argv[2], "--quiet"])
        main(["--model", sys.argv[1], "--int8", "--input", sys.argv[2]])
    """
    (tmp_path / "sources.txt").write_text("A book likes the small dog.\n", encoding="utf-8")
    shutil.copytree(translation_folder, folder := tmp_path / "model")
    (folder / "model.safetensors").write_bytes(b"damaged")  # read, it would be refused in other words
    result = run_without("nothing", script, folder, tmp_path / "sources.txt", translation_folder,
                         env_extra={"VASWANI_HF_CACHE": str(tmp_path / "there")})
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "here"))
    translate(["--model", str(translation_folder), "--engine", "ctranslate2", "--int8", "--input",
               str(tmp_path / "sources.txt"), "--quiet"])
    ctranslate2_int8 = capsys.readouterr().out
    torch.manual_seed(0)
    expected = VaswaniForConditionalGeneration(tiny_config()).eval().generate(torch.arange(3, 12).view(1, 9),
                                                                              num_beams=4, max_new_tokens=6)
    missing = (f"int8 decoding needs torch's dynamic quantization (torch.ao.quantization), which torch "
               f"{torch.__version__} lacks: vaswani-translate --engine ctranslate2 --int8 decodes in CTranslate2's "
               "int8")
    assert ctranslate2_int8.count("\n") == 1 and ctranslate2_int8.strip()
    assert result.stdout == f"{expected.tolist()}\n{missing}\n{ctranslate2_int8}", result.stderr[-3000:]
    assert (result.returncode, result.stderr) == (1, f"error: {missing}\n")
