# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""`generate()` with beams that share their source, a lean decoder step and the weights packed for the call:
`fast_cpu(model)`'s three decoding mechanisms, each on for a call only where the model's plan (`model.fast_cpu_plan`,
measured by fast_cpu.py) says so.

* Beams share their source (plan["beam"]["shared"]): the encoder-decoder attentions, swapped for
  `fast_attention.FastAttention`, compute each source's keys and values once and let its beams attend to them as one
  block of queries. Only with attention kernels whose masks broadcast over such a block (`SHARED_SOURCE_KERNELS`).
  A cache that `generate()` returns or takes keeps transformers' layout, one cross-attention row per sequence.
* The decoder's steps after a call's first computed in fewer Python calls (plan[mode]["lean"]): lean.py.
* A packing block (`kernels.PACKING.block()`) around the call (plan[mode]["packed"], mode "greedy" or "beam"): the
  weights cannot change during it, so the linear layers multiply by copies reordered once into oneDNN's layout.

`bind_plan(model)` binds this to one model object, around whatever `generate` it has (the installed class's, or a
folder's own code under `trust_remote_code=True`): `model.fast_decoding(num_beams)` is the block of a decoding loop
(vaswani-translate enters it around its search), and transformers' cache-reordering hook is overridden on that object
only. A model not transformed is left as transformers made it.
"""

import contextlib
import types

import torch
from transformers.cache_utils import Cache, EncoderDecoderCache
from transformers.utils import ModelOutput

from .attention import SHARED_SOURCE_KERNELS, attention_modules, swap
from .kernels import PACKING
from .lean import lean_block

# As the model files decode and train.
PLAIN = {"greedy": {"lean": False, "packed": False}, "beam": {"shared": False, "lean": False, "packed": False},
         "training": {"onednn": False}}


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


def bind_plan(model) -> None:
    """Bind the plan's decoding to `model`, in place (methods of the object, so that a deep copy of it is bound to the
    copy), its encoder-decoder attentions swapped for ones that can share a source."""
    if "fast_decoding" in vars(model):
        return  # bound already
    for module in attention_modules(model, cross_only=True):
        swap(module)
    model._inner_generate = model.generate  # the class's generate() (bound): transformers' or the paper's search
    model.generate = types.MethodType(_generate, model)
    model.fast_decoding = types.MethodType(_fast_decoding, model)
    model.fast_cpu_plan = PLAIN
    model._reorder_cache = _reorder_cache


def _generate(self, *args, **kwargs):
    """The model's own generate() in the plan's block for the call's mode, a cache passed in or returned in
    transformers' layout."""
    num_beams = kwargs.get("num_beams") or (kwargs.get("generation_config") or self.generation_config).num_beams or 1
    cache = kwargs.get("cache", kwargs.get("past_key_values"))
    source = args[0] if args else kwargs.get("inputs", kwargs.get("input_ids"))
    with self.fast_decoding(num_beams) as shared:
        if shared and isinstance(cache, EncoderDecoderCache) and source is not None:
            set_cross_attention_rows(cache, source.shape[0])  # a cache that an earlier generate() returned
        output = self._inner_generate(*args, **kwargs)
    cache = output.get("cache") if isinstance(output, ModelOutput) else None
    if shared and isinstance(cache, EncoderDecoderCache) and cache.self_attention_cache.layers:
        set_cross_attention_rows(cache, cache.self_attention_cache.layers[0].keys.shape[0])
    return output


@contextlib.contextmanager
def _fast_decoding(self, num_beams: int = 1):
    """The plan's mechanisms for a decoding loop of `num_beams` beams: shared sources (yields whether they are on),
    the lean step (lean.py) and a packing block (kernels.py)."""
    plan = self.fast_cpu_plan["beam" if num_beams > 1 else "greedy"]
    shared = plan.get("shared", False) and self.config._attn_implementation in SHARED_SOURCE_KERNELS
    modules = attention_modules(self, cross_only=True)
    for module in modules:
        module.group = num_beams if shared else 1
    try:
        with (PACKING.block() if plan["packed"] else contextlib.nullcontext(),
              lean_block(self.get_decoder()) if plan["lean"] else contextlib.nullcontext()):
            yield shared
    finally:
        for module in modules:
            module.group = 1


def _reorder_cache(cache: Cache, beam_idx: torch.LongTensor) -> Cache:
    """Beam search (transformers calls this hook) reorders only the self-attention cache: the beams of a source all
    attend to the same encoder output, so their cross-attention keys and values are equal and stay put."""
    if isinstance(cache, EncoderDecoderCache):
        cache.self_attention_cache.reorder_cache(beam_idx)
    else:
        cache.reorder_cache(beam_idx)
    return cache
