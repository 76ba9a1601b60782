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

The parameters stay the model's own (saved, loaded, optimized and sharded as before); the products are the same,
rounded as one larger product rounds. `training/run.py` applies it on a GPU unless told not to (`--no_fast_gpu`).
Models loaded from a Hub repository's code keep theirs.
"""

import torch
from torch import nn

from .modeling_vaswani import VaswaniAttention


def fused(layers: tuple[nn.Linear, ...], input: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What each of the linear `layers` makes of `input`, computed as one product: x [W_1; W_2; ...]^T + [b_1; ...],
    split."""
    weight = torch.cat([layer.weight for layer in layers])
    bias = torch.cat([layer.bias for layer in layers])
    return nn.functional.linear(input, weight, bias).split([layer.out_features for layer in layers], dim=-1)


class FusedProjections(VaswaniAttention):
    """`VaswaniAttention` whose projections of one input run as one product, except in float32 training."""

    def projections(self, hidden_states: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if torch.is_grad_enabled() and not torch.is_autocast_enabled(hidden_states.device.type):
            return super().projections(hidden_states, source)  # fused, backward would keep a copy of the weights
        if source is hidden_states:  # self-attention: Q, K and V of the same rows
            return fused((self.q_proj, self.k_proj, self.v_proj), hidden_states)
        return self.q_proj(hidden_states), *fused((self.k_proj, self.v_proj), source)


def fast_gpu(model: nn.Module) -> nn.Module:
    """`model`, in place, with each attention's projections fused (module docstring); applying it again changes
    nothing."""
    for module in model.modules():
        if type(module) is VaswaniAttention:
            module.__class__ = FusedProjections
    return model
