# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""The attention module that the speed transforms swap in for the model file's `VaswaniAttention`: the same §3.2.2,
with two options the model file does not have, each giving the same products rounded differently.

* `fuse` (`fast_gpu`): the projections of one input as one product over the weights side by side, Q, K and V in
  self-attention, K and V in encoder-decoder attention; only under autocast or without gradient, because in
  float32 training the concatenated weight, kept for backward, would be a second copy of the weights.
* `group` = n (`fast_cpu`, for the beam search under way): the n beams of a source share it. transformers' beam
  search and the GNMT search repeat the encoder output once per beam (n consecutive rows); encoder-decoder attention
  computes the keys and values from one of each source's rows, caches them so, and lets the source's beams attend to
  them as one block of n·T queries: a quarter of the cross-attention projections and cache at beam 4. Only kernels
  whose masks broadcast over such a block take it (`SHARED_SOURCE_KERNELS`: decoding.py asks), and only in a
  decoding step (a cache given): a pass without one, such as the search's teacher-forced pass over the hypotheses it
  returns (n per source, not n beams), reads every row.

`swap(module)` makes `module`, of a class named `VaswaniAttention` (the installed one or a Hub folder's), an instance
of a subclass of its own class with this forward; its parameters stay its own.
"""

import functools

import torch
from torch import nn
from transformers.cache_utils import EncoderDecoderCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from ..modeling_vaswani import eager_attention_forward

SHARED_SOURCE_KERNELS = ("eager", "sdpa")  # their masks broadcast over a block of query rows


def fused(layers: tuple[nn.Linear, ...], input: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """What each of the linear `layers` makes of `input`, computed as one product: x [W_1; W_2; ...]^T + [b_1; ...],
    split."""
    weight = torch.cat([layer.weight for layer in layers])
    bias = torch.cat([layer.bias for layer in layers])
    return nn.functional.linear(input, weight, bias).split([layer.out_features for layer in layers], dim=-1)


class FastAttention:
    """The forward of a swapped `VaswaniAttention` (module docstring)."""

    fuse = False
    group = 1

    def forward(self, hidden_states, key_value_states=None, cache=None, attention_mask=None, **kwargs):
        batch_size, length = hidden_states.shape[:2]
        is_cross = key_value_states is not None
        both = isinstance(cache, EncoderDecoderCache)
        own_cache = (cache.cross_attention_cache if both else None) if is_cross else (
            cache.self_attention_cache if both else cache)
        if is_cross and own_cache is not None and cache.is_updated.get(self.layer_idx):
            query = self.q_proj(hidden_states)
            key, value = own_cache.layers[self.layer_idx].keys, own_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross else hidden_states
            if is_cross and self.group > 1 and own_cache is not None:  # a decoding step, not a teacher-forced pass
                source = source[:: self.group]  # one of each source's n equal rows
            query, key, value = self.projections(hidden_states, source)
            key = key.unflatten(-1, (-1, self.d_k)).transpose(1, 2)  # (B', h, S, d_k)
            value = value.unflatten(-1, (-1, self.d_v)).transpose(1, 2)  # (B', h, S, d_v)
            if own_cache is not None:
                key, value = own_cache.update(key, value, self.layer_idx)
                if is_cross:
                    cache.is_updated[self.layer_idx] = True
        group = batch_size // key.shape[0] if is_cross else 1  # query rows per key row: n where beams share a source
        query = query.view(batch_size // group, group * length, -1, self.d_k).transpose(1, 2)  # (B', h, n·T, d_k)
        if group > 1 and attention_mask is not None:  # one mask row per source, the same for all of its queries
            attention_mask = attention_mask[::group, :, :1]
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                    eager_attention_forward)
        output, weights = attention_interface(self, query, key, value, attention_mask, scaling=self.scaling,
                                              dropout=self.dropout if self.training else 0.0, **kwargs)
        if group > 1 and weights is not None:  # (B, h, n·T, S) -> (n·B, h, T, S)
            weights = weights.unflatten(2, (group, length)).transpose(1, 2).flatten(0, 1)
        output = output.reshape(batch_size, length, -1).contiguous()  # (B', n·T, h, d_v) is (n·B', T, h·d_v)
        return self.out_proj(output), weights

    def projections(self, hidden_states: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """Q W^Q of `hidden_states`, K W^K and V W^V of `source` (the same tensor in self-attention)."""
        if not self.fuse or (torch.is_grad_enabled() and not torch.is_autocast_enabled(hidden_states.device.type)):
            return self.q_proj(hidden_states), self.k_proj(source), self.v_proj(source)
        if source is hidden_states:  # self-attention: Q, K and V of the same rows
            return fused((self.q_proj, self.k_proj, self.v_proj), hidden_states)
        return self.q_proj(hidden_states), *fused((self.k_proj, self.v_proj), source)


@functools.cache
def fast_class(base: type) -> type:
    return type(f"Fast{base.__name__}", (FastAttention, base), {"__module__": __name__})


def swap(module: nn.Module) -> FastAttention:
    """`module` as a `FastAttention` of its own class (in place; again: unchanged)."""
    if not isinstance(module, FastAttention):
        module.__class__ = fast_class(type(module))
    return module


def check_vaswani(model: nn.Module, transform: str) -> None:
    """A one-line TypeError unless `model` is a vaswani_hf model (a Hub folder's own class as well)."""
    if getattr(getattr(model, "config", None), "model_type", None) != "vaswani":
        raise TypeError(f"{transform}: takes a vaswani_hf model (VaswaniForConditionalGeneration), got "
                        f"{type(model).__name__}")


def attention_modules(model: nn.Module, cross_only: bool = False) -> list[nn.Module]:
    """The model's attention modules (a Hub folder's own class as well), or its encoder-decoder attentions."""
    return [module for name, module in model.named_modules() if type(module).__name__.endswith("VaswaniAttention")
            and (not cross_only or name.endswith("encoder_attn"))]
