"""The int8 inference copy (vaswani_hf.quantization): every linear layer quantized, the float32 model untouched,
logits close to the float32 model's, and the translator's --int8 flag."""

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from conftest import random_ids, tiny_model
from vaswani_hf import quantize_int8
from vaswani_hf.modeling_vaswani import VaswaniLinear


def test_the_int8_copy_quantizes_every_linear_layer_and_leaves_the_model_alone():
    model = tiny_model().train()
    before = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    linear_names = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    quantized = quantize_int8(model)
    assert {name for name, module in quantized.named_modules() if isinstance(module, DynamicQuantizedLinear)} == linear_names
    assert "lm_head" in linear_names and len(linear_names) == 2 * (4 + 2) + 3 * (4 + 4 + 2) + 1  # attention, FFN, output
    assert all(type(module) is VaswaniLinear for name, module in model.named_modules() if name in linear_names)
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
