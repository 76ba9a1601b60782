"""An int8 copy of a model for CPU inference — an option beside the paper, which decodes in float32.

torch's dynamic quantization replaces every `nn.Linear` (the attention projections, the FFN and the output
projection) by an int8 one: weights quantized once, per output channel; activations quantized per batch as
they arrive; products accumulated in int32 by fbgemm. The embeddings, LayerNorms and softmaxes stay float32.
Decoding streams a quarter of the weight bytes, which is what bounds its speed on a CPU (README, Speed).

The copy is for `generate()` and the translator, not for training or `save_pretrained`: its output projection
no longer shares storage with the embedding.
"""

import copy
import warnings

import torch
from torch import nn


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` (in eval mode, on the CPU) whose linear layers compute in int8."""
    if any(parameter.device.type != "cpu" for parameter in model.parameters()):
        raise ValueError("int8 dynamic quantization runs on the CPU: move the model there first (model.cpu())")
    quantized = copy.deepcopy(model)
    for module in quantized.modules():
        if isinstance(module, nn.Linear):  # VaswaniLinear, from this package or from a Hub repository's code
            module.__class__ = nn.Linear  # quantize_dynamic matches exact types; the oneDNN path is float32 only
    with warnings.catch_warnings():
        # torch marks torch.ao.quantization deprecated (torchao is the successor); it works in the pinned 2.13.
        warnings.filterwarnings("ignore", message=".*quantize_per_(tensor|channel).*deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(
            quantized, {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True
        )
