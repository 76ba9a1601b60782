# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""The decoder's step of a decoding loop in fewer Python calls: `fast_cpu`'s "lean" mechanism.

Each step of a decoding loop runs the decoder over one new token a row. For a small model on a CPU much of that step is
Python: transformers' mask builders and output decorators, the attention interface, a dozen module calls a layer.
`lean_forward` computes the same step with the same kernels and arguments as the model file (`F.linear`,
`F.layer_norm`, SDPA, the cache's `update`), post-LN or pre-LN, and with beams sharing their source where the
encoder-decoder attentions do (attention.py). It takes the step only where it is that step (`applies`): eval mode,
transformers' own SDPA kernel, one position a row given as ids, an `EncoderDecoderCache` whose cross-attention keys and
values are in place (every step after a call's first), no decoder mask and a 2D source mask or none, rows matching the
source's, nothing recorded (hidden states, attentions). Everything else, the first step of each call among it, goes to
the decoder's own forward, whose checks speak.

`lean_block(decoder)` puts it in place of the decoder's forward for a decoding loop (decoding.py enters it where the
plan says so), and takes it away after.
"""

import contextlib
import types
from collections.abc import Iterator

import torch
from torch import nn
from torch.nn import functional as F
from transformers.cache_utils import EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

from .kernels import PACKING

RECORDED = ("output_attentions", "output_hidden_states")  # outputs that only the decoder's own forward records


@contextlib.contextmanager
def lean_block(decoder: nn.Module) -> Iterator[None]:
    """The decoder's steps computed by `lean_forward` inside the block (blocks may nest)."""
    if "forward" in vars(decoder):  # an outer block's
        yield
        return
    decoder.forward = types.MethodType(lean_forward, decoder)
    try:
        yield
    finally:
        del decoder.forward


def applies(decoder, input_ids, attention_mask, encoder_hidden_states, encoder_attention_mask, cache, inputs_embeds,
            kwargs) -> bool:
    """Whether this call of the decoder is a decoding step that `lean_forward` computes (module docstring). Whatever
    `use_cache` says, the decoder's own forward updates a given cache, as this one does."""
    if decoder.training or decoder.config._attn_implementation != "sdpa":
        return False
    if ALL_ATTENTION_FUNCTIONS["sdpa"] is not sdpa_attention_forward:  # another kernel registered under the name
        return False
    if inputs_embeds is not None or input_ids is None or input_ids.dim() != 2 or input_ids.shape[1] != 1:
        return False
    if not isinstance(cache, EncoderDecoderCache) or not cache.is_updated.get(0) or attention_mask is not None:
        return False
    if any(kwargs.get(name) or getattr(decoder.config, name) for name in RECORDED):
        return False
    rows, source_length = input_ids.shape[0], cache.cross_attention_cache.layers[0].keys.shape[2]  # (B', h, S, d_k)
    return encoder_hidden_states is not None and encoder_hidden_states.shape[0] == rows and (
        encoder_attention_mask is None or encoder_attention_mask.shape == (rows, source_length))


def lean_forward(self, input_ids=None, attention_mask=None, encoder_hidden_states=None, encoder_attention_mask=None,
                 cache=None, inputs_embeds=None, use_cache=None, **kwargs):
    """The decoder's forward: a decoding step computed here where it `applies`, else the decoder's own."""
    if not applies(self, input_ids, attention_mask, encoder_hidden_states, encoder_attention_mask, cache,
                   inputs_embeds, kwargs):
        return type(self).forward(
            self, input_ids=input_ids, attention_mask=attention_mask, encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask, cache=cache, inputs_embeds=inputs_embeds,
            use_cache=use_cache, **kwargs)
    self_cache, cross_cache = cache.self_attention_cache, cache.cross_attention_cache
    hidden_states = self.embed(input_ids, None, self_cache.get_seq_length(), "decoder_input_ids")  # (B, 1, D)
    group = input_ids.shape[0] // cross_cache.layers[0].keys.shape[0]  # beams a source, as in attention.py
    source_mask = None  # as transformers builds it for SDPA: none without padding, else True where a row attends
    if encoder_attention_mask is not None and not encoder_attention_mask.all():
        source_mask = encoder_attention_mask[::group, None, None, :].bool()  # (B', 1, 1, S)
    torchs = isinstance(self.layers[0].fc1, nn.Linear)  # else an int8 copy's layers (quantization.py)
    linear = plain_linear if torchs and not PACKING.open else own_linear
    for layer in self.layers:
        norm = layer.self_attn_layer_norm
        output = self_attention(layer.self_attn, linear, sublayer_input(layer, hidden_states, norm), self_cache)
        hidden_states = add_and_norm(layer, hidden_states, output, norm)
        norm, source = layer.encoder_attn_layer_norm, cross_cache.layers[layer.encoder_attn.layer_idx]
        output = attend(layer.encoder_attn, linear, sublayer_input(layer, hidden_states, norm), source.keys,
                        source.values, source_mask, group)
        hidden_states = add_and_norm(layer, hidden_states, output, norm)
        norm = layer.final_layer_norm
        output = linear(layer.fc2, layer.activation_fn(linear(layer.fc1, sublayer_input(layer, hidden_states, norm))))
        hidden_states = add_and_norm(layer, hidden_states, output, norm)
    return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=self.finish(hidden_states), cache=cache)


def plain_linear(module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    return F.linear(x, module.weight, module.bias)


def own_linear(module: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return module.forward(x)  # a PackedLinear in a packing block by its packed weight (kernels.py), or an int8 layer


def layer_norm(norm: nn.LayerNorm, x: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def sublayer_input(layer, x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """As the model file's `VaswaniLayer`: x, or LayerNorm(x) in pre-LN."""
    return layer_norm(norm, x) if layer.normalize_before else x


def add_and_norm(layer, residual: torch.Tensor, output: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """As the model file's `VaswaniLayer` in eval (no dropout): §3.1's LayerNorm(x + Sublayer(x)), or
    x + Sublayer(LayerNorm(x)) in pre-LN."""
    return residual + output if layer.normalize_before else layer_norm(norm, residual + output)


def heads(x: torch.Tensor, width: int) -> torch.Tensor:
    return x.unflatten(-1, (-1, width)).transpose(1, 2)  # (B, 1, h·d) -> (B, h, 1, d)


def self_attention(attention, linear, x: torch.Tensor, cache) -> torch.Tensor:
    """Masked self-attention of the new position to the cached ones and itself (no mask: nothing follows it)."""
    key = heads(linear(attention.k_proj, x), attention.d_k)  # (B, h, 1, d_k)
    value = heads(linear(attention.v_proj, x), attention.d_v)
    key, value = cache.update(key, value, attention.layer_idx)  # (B, h, t, d)
    return attend(attention, linear, x, key, value, None, 1)


def attend(attention, linear, x: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
           group: int) -> torch.Tensor:
    """Multi-head attention of one query position a row to `key` and `value` (B', h, S, d), `group` = B / B' rows of
    `x` (B, 1, D) a key row, as one block of queries (attention.py); the output projected by W^O."""
    rows = x.shape[0]
    query = linear(attention.q_proj, x).view(rows // group, group, -1, attention.d_k)
    query = query.transpose(1, 2)  # (B', h, n, d_k)
    output = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, dropout_p=0.0, scale=attention.scaling)
    output = output.transpose(1, 2).reshape(rows, 1, -1)  # (B', n, h, d_v) is (B, 1, h·d_v)
    return linear(attention.out_proj, output)

