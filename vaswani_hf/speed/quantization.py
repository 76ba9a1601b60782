"""An int8 copy of a model for CPU inference — an option beside the paper, which decodes in float32.

torch's dynamic quantization replaces every `nn.Linear` (the attention projections, the FFN and the output
projection) by an int8 one: weights quantized once, per output channel; activations quantized per batch as
they arrive; products accumulated in int32 by fbgemm. The embeddings, LayerNorms and softmaxes stay float32.
Decoding streams a quarter of the weight bytes, which is what bounds its speed on a CPU (README, Speed).

Activations get all 8 bits on CPUs with VNNI (`Int8Linear`); torch's layer keeps them to 7 bits everywhere, because
without VNNI fbgemm adds pairs of 8-bit products in 16 bits, which can saturate. The 7th bit matters: on the
cpu-medium Multi30k model, test2016 sacreBLEU is 35.39 with 8-bit activations and 34.82 with 7-bit ones, against
35.36 in float32 (README, Speed).

The copy is for `generate()` and the translator, not for training or `save_pretrained`: its output projection
no longer shares storage with the embedding. `fast_cpu` plans its decoding, of the mechanisms that keep its tokens
(fast_cpu.py's `INT8_CANDIDATES`; `vaswani-translate --int8` applies it).
"""

import copy
import warnings

import torch
from torch import nn

from .decoding import PLAIN

try:  # torch's legacy quantization, deprecated for torchao, which torch means to remove: without it, no int8 copy
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic
except ImportError:
    DynamicLinear = None

MISSING = (f"int8 decoding needs torch's dynamic quantization (torch.ao.quantization), which torch "
           f"{torch.__version__} lacks: vaswani-translate --engine ctranslate2 --int8 decodes in CTranslate2's int8")

if DynamicLinear is not None:

    class Int8Linear(DynamicLinear):
        """torch's dynamic int8 linear layer with activations quantized to 8 bits rather than 7 (`reduce_range=False`):
        for CPUs with VNNI, whose int8 products accumulate in 32 bits."""

        def forward(self, input: torch.Tensor) -> torch.Tensor:
            return torch.ops.quantized.linear_dynamic(input, self._packed_params._packed_params, reduce_range=False)


def full_range_activations() -> bool:
    """Whether this CPU multiplies 8-bit activations without saturating: it has VNNI (AVX512-VNNI)."""
    return getattr(torch.cpu, "_is_vnni_supported", lambda: False)()


def quantize_int8(model: nn.Module) -> nn.Module:
    """A copy of `model` (in eval mode, on the CPU) whose linear layers compute in int8; a RuntimeError (`MISSING`)
    where torch has no dynamic quantization."""
    if DynamicLinear is None:
        raise RuntimeError(MISSING)
    if any(parameter.device.type != "cpu" for parameter in model.parameters()):
        raise ValueError("int8 dynamic quantization runs on the CPU: move the model there first (model.cpu())")
    quantized = copy.deepcopy(model)
    if "fast_cpu_plan" in vars(quantized):  # a float32 model's plan is not the copy's: fast_cpu(copy) measures one
        quantized.fast_cpu_plan = PLAIN
    for module in quantized.modules():
        if isinstance(module, nn.Linear):  # VaswaniLinear, from this package or from a Hub repository's code
            module.__class__ = nn.Linear  # quantize_dynamic matches exact types; the oneDNN path is float32 only
    with warnings.catch_warnings():
        # torch marks torch.ao.quantization deprecated (torchao is the successor); it works in the pinned 2.13.
        warnings.filterwarnings("ignore", message=".*quantize_per_(tensor|channel).*deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message="torch.ao.quantization is deprecated", category=DeprecationWarning)
        quantize_dynamic(quantized, {nn.Linear: per_channel_dynamic_qconfig}, dtype=torch.qint8, inplace=True)
    if full_range_activations():
        for module in quantized.modules():
            if type(module) is DynamicLinear:
                module.__class__ = Int8Linear
    return quantized


def is_int8(model: nn.Module) -> bool:
    """Whether `model` is an int8 copy: its linear layers are torch's dynamic int8 ones."""
    return DynamicLinear is not None and any(isinstance(module, DynamicLinear) for module in model.modules())
