# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""`generate()` with one encoder row per source and the weights packed for the call: `fast_cpu(model)`'s two
mechanisms, each on for a call only where the model's plan (`model.fast_cpu_plan`, measured by fast_cpu.py) says so.

* Beams share their source's encoder row (plan["beam"]["shared"]). transformers repeats every input once per beam;
  here the encoder output and the source mask stay one row per source, and the decoder's encoder-decoder attention
  computes each source's keys and values once and lets its beams attend to them as one block of queries
  (`VaswaniAttention`): a quarter of the cross-attention projections and cache at beam 4. Only with attention
  kernels whose masks broadcast over such a block (`SHARED_SOURCE_KERNELS`); other kernels get transformers' repeated
  rows. What `generate()` returns and takes keeps transformers' layout: a returned cache has one cross-attention row
  per sequence, and a cache passed back in is read either way.
* A packing block (`kernels.PACKING.block()`) around the call (plan[mode]["packed"], mode "greedy" or "beam"): the
  weights cannot change during it, so the linear layers multiply by copies reordered once into oneDNN's layout.

`share_source_rows(model)` binds this to one model object, around whatever `generate` it has (the installed
class's, or a folder's own code under `trust_remote_code=True`), and overrides transformers' two hooks on that
object only. A model not transformed is left as transformers made it.
"""

import contextlib
import types

import torch
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.utils import ModelOutput

from .checks import SHARED_SOURCE_KERNELS
from .kernels import PACKING

PLAIN = {"greedy": {"packed": False}, "beam": {"shared": False, "packed": False}}  # as the model files decode


def cross_attention_rows(cache: EncoderDecoderCache) -> int | None:
    """Rows of the cross-attention cache once it holds the encoder output's keys and values, else None."""
    layers = cache.cross_attention_cache.layers
    return layers[0].keys.shape[0] if layers and cache.is_updated.get(0) else None


def set_cross_attention_rows(cache: EncoderDecoderCache, rows: int) -> None:
    """Repeat each source's cross-attention keys and values for its sequences (beams), or keep one row per source;
    the rows of a source are equal, so either way nothing is lost."""
    current = cross_attention_rows(cache)
    if current is None or current == rows:
        return
    for layer in cache.cross_attention_cache.layers:
        if rows > current:  # (B, h, S, d) -> (n·B, h, S, d)
            layer.keys, layer.values = (t.repeat_interleave(rows // current, 0) for t in (layer.keys, layer.values))
        else:  # every n-th row: one per source
            layer.keys, layer.values = (t[:: current // rows].contiguous() for t in (layer.keys, layer.values))


def share_source_rows(model) -> None:
    """Bind shared-source decoding and the decoding block to `model`, in place (methods of the object, so that a deep
    copy of it is bound to the copy)."""
    if "_expand_inputs_for_generation" in vars(model):
        return  # bound already
    model._inner_generate = model.generate  # the class's generate() (bound): transformers' or the paper's search
    model.generate = types.MethodType(_generate, model)
    model.packed_weights = types.MethodType(_packed_weights, model)  # vaswani-translate's search enters it too
    model.fast_cpu_plan = PLAIN
    model._shares_source_rows = False  # in the generate() call under way
    model._expand_inputs_for_generation = types.MethodType(_expand_inputs_for_generation, model)
    model._reorder_cache = _reorder_cache


def _generate(self, *args, **kwargs):
    """The model's own generate() with the mechanisms its plan takes for the call's mode, a returned cache given
    transformers' layout."""
    num_beams = kwargs.get("num_beams") or (kwargs.get("generation_config") or self.generation_config).num_beams
    shared = self.fast_cpu_plan["beam"]["shared"] and self.config._attn_implementation in SHARED_SOURCE_KERNELS
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    source = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    if shared and isinstance(cache, EncoderDecoderCache) and source is not None:
        set_cross_attention_rows(cache, source.shape[0])  # a cache that an earlier generate() returned
    self._shares_source_rows = shared
    try:
        with self.packed_weights(num_beams or 1):
            output = self._inner_generate(*args, **kwargs)
    finally:
        self._shares_source_rows = False
    cache = output.get("cache") if isinstance(output, ModelOutput) else None
    if shared and isinstance(cache, EncoderDecoderCache) and cache.self_attention_cache.layers:
        set_cross_attention_rows(cache, cache.self_attention_cache.layers[0].keys.shape[0])
    return output


def _packed_weights(self, num_beams: int = 1):
    """A packing block for a decoding loop of `num_beams` if the plan packs for its mode (kernels.py), else nothing."""
    packed = self.fast_cpu_plan["beam" if num_beams > 1 else "greedy"]["packed"]
    return PACKING.block() if packed else contextlib.nullcontext()


def _reorder_cache(cache: Cache, beam_idx: torch.LongTensor) -> Cache:
    """Beam search (transformers calls this hook) reorders only the self-attention cache: the beams of a source all
    attend to the same encoder output, so their cross-attention keys and values are equal and stay put."""
    if isinstance(cache, EncoderDecoderCache):
        cache.self_attention_cache.reorder_cache(beam_idx)
    else:
        cache.reorder_cache(beam_idx)
    return cache


def _expand_inputs_for_generation(self, expand_size: int = 1, is_encoder_decoder: bool = False,
                                  input_ids: torch.LongTensor | None = None, **model_kwargs):
    """transformers repeats every input once per beam (or returned sequence); the encoder output and the source mask
    stay one row per source here. The encoder outputs that `generate(return_dict_in_generate=True)` returns
    therefore have one row per source too."""
    if not self._shares_source_rows:
        return GenerationMixin._expand_inputs_for_generation(self, expand_size, is_encoder_decoder, input_ids,
                                                             **model_kwargs)
    shared = {key: model_kwargs.pop(key) for key in ("encoder_outputs", "attention_mask") if key in model_kwargs}
    if is_encoder_decoder and shared.get("encoder_outputs") is None:
        raise ValueError("If `is_encoder_decoder` is True, make sure that `encoder_outputs` is defined.")
    input_ids, model_kwargs = GenerationMixin._expand_inputs_for_generation(self, expand_size, False, input_ids,
                                                                            **model_kwargs)
    return input_ids, {**model_kwargs, **shared}
