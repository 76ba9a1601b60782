# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""GPU speed as an explicit transform of a model object: `fast_gpu(model)`.

On a GPU, a training step of the base model at the batch sizes the paper's recipe uses is paced by the host launching
kernels, not by the GPU computing them (`benchmarks/gpu_check.py`, part 7). This transform, applied in place to one
model object, launches fewer: each attention layer computes the projections of one input as one product over its
layers' weights side by side — Q, K and V in self-attention, K and V in encoder-decoder attention — where the model
files (`modeling_vaswani.py`, what travels to the Hub) run one `nn.Linear` each, as Marian does.

It fuses where that keeps no more memory: under autocast, which casts the weights to new tensors either way, and
without gradient. In float32 training the concatenated weight, kept for backward, would be a second copy of the
weights, so there each projection runs as the model file writes it.

The attention modules are swapped for `fast_attention.FastAttention`; the parameters stay the model's own (saved,
loaded, optimized and sharded as before); the products are the same, rounded as one larger product rounds.
`training/run.py` applies it on a GPU unless told not to (`--no_fast_gpu`).
"""

from torch import nn

from .attention import attention_modules, check_vaswani, swap


def fast_gpu(model: nn.Module) -> nn.Module:
    """`model`, in place, with each attention's projections fused (module docstring, fast_attention.py); applying it
    again changes nothing."""
    check_vaswani(model, "fast_gpu")
    for module in attention_modules(model):
        swap(module).fuse = True
    return model
