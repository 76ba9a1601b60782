# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""CPU speed as an explicit transform of a model object: `fast_cpu(model)`.

The model files (`modeling_vaswani.py`, what travels to the Hub) use torch's `nn.Linear` and transformers' attention
kernels, as Marian does. On a CPU, which kernel computes a product fastest depends on the machine (`kernels.py`);
this transform, applied in place to one model object, lets it choose by measurement:

* every `nn.Linear` becomes a `VaswaniLinear`: its float32 CPU products without gradient run in the kernel measured
  fastest for their shape (torch's, oneDNN's, oneDNN's with the weight packed once per `generate()`); in training,
  on a GPU, under autocast and under compilation it computes as `nn.Linear`;
* attention runs the "vaswani_measured" kernel: SDPA, or without gradient the eager product where that is measured
  faster for the shape;
* `generate()` shares each source's encoder row among its beams and packs the weights once per call (`decoding.py`).

The same products are computed, rounded differently, and only where no gradient flows: training is torch's, so a run
gives the same weights transformed or not, quiet or busy. `vaswani-translate` and `training/run.py` apply it on a CPU
unless told not to (`--no_fast_cpu`). Models loaded from a Hub repository's code take it as well (their layers are
torch's), and a transformed model saves as any other: the same weights, the same code files, no kernel named in
config.json.
"""

from torch import nn
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .decoding import share_source_rows
from .kernels import MEASURED_ATTENTION, VaswaniLinear, measured_attention
from .modeling_vaswani import eager_attention_forward


def fast_cpu(model: nn.Module) -> nn.Module:
    """`model`, in place, with CPU kernels chosen by measurement (module docstring); applying it again changes
    nothing."""
    ALL_ATTENTION_FUNCTIONS.register(MEASURED_ATTENTION, measured_attention(eager_attention_forward))
    ALL_MASK_ATTENTION_FUNCTIONS.register(MEASURED_ATTENTION, sdpa_mask)
    for module in model.modules():
        if type(module) is nn.Linear:
            module.__class__ = VaswaniLinear  # the same parameters; the forward chooses its kernel
    if hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(MEASURED_ATTENTION)
    if hasattr(model, "generate"):
        share_source_rows(model)
    return model
