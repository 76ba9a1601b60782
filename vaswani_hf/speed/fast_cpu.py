# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""CPU speed as an explicit transform of a model object: `fast_cpu(model)`, never slower than the plain model.

The model files (`modeling_vaswani.py`, what travels to the Hub) use torch's `nn.Linear` and transformers' attention
kernels, as Marian does. This transform, applied in place to one model object, offers four mechanisms: in
`generate()` (decoding.py), beams that share their source's keys and values (in beam search), the decoder's steps in
fewer Python calls (lean.py) and linear layers that multiply by weights packed once per call into oneDNN's layout; in
training, linear layers whose products and gradients run in oneDNN instead of torch's BLAS (`kernels.PackedLinear`).
Which of them pays depends on the CPU and on the model's sizes (packing slowed greedy decoding of a small model and
sped up the base model's on one Xeon: benchmarks/README.md). So each is taken only where whole calls were measured
faster with it:

* the plan: for greedy decoding, lean or not, and packed or not; for beam search, shared rows or not, lean or not,
  and packed or not; for training, oneDNN or not. A mechanism is taken if the calls with it (whole `generate()` calls;
  a forward and backward of the model) took at most `MARGIN` of the time of those without, on random inputs of the
  model's sizes (`PROBE`), by both the best of `ROUNDS` interleaved rounds and the median of the rounds' ratios; else
  the plain way stays;
* measured once per CPU model, torch version, thread count, model sizes and mode, and kept as JSON, a file per mode,
  in `$VASWANI_HF_CACHE/fast_cpu/` (else `~/.cache/vaswani_hf/fast_cpu/`); later calls read it back.
  `vaswani-translate`, which only decodes, plans decoding alone (training stays torch's): after a training run of
  the same sizes, it reads that run's decoding choices and times nothing; processes that need a plan at once wait
  for one to time it. The same machine therefore decodes and trains the same way, busy or quiet: the plan is timed
  once, the products never. (A training run also keeps its plan in its checkpoints: resumed, it computes as it did.)

An int8 copy (`quantize_int8`) only decodes: its plan is for decoding, timed with its own calls (`INT8_CANDIDATES`).

The same products are computed, rounded differently: a plan's decoding gives the plain model's tokens, its training
the plain model's weights to float32's rounding. `vaswani-translate` and `training/run.py` apply it on a CPU unless
told not to (`--no_fast_cpu`). Models loaded from a Hub repository's code take it as well, and a transformed model
saves as any other.
"""

import copy
import functools
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn
from transformers import GenerationConfig
from transformers.utils import logging

from .attention import check_vaswani
from .decoding import PLAIN, bind_plan
from .kernels import ONEDNN, PACKING, PackedLinear, cache_root, cpu_name, kept_apart
from .quantization import is_int8

logger = logging.get_logger(__name__)

# A round: one generate() call of each decoding candidate, over `sources` random sources of `source_length` tokens;
# one forward and backward of each training candidate, over `pairs` random pairs of `pair_length` tokens a side.
PROBE = {"sources": 16, "source_length": 24, "new_tokens": 16, "pairs": 32, "pair_length": 32}
ROUNDS = 5
MARGIN = 0.97  # a mechanism must save at least 3% of the calls' time: less is this measurement's noise
SIZES = ("vocab_size", "d_model", "d_ff", "num_heads", "d_k", "d_v", "num_layers", "num_decoder_layers")


def probe(config) -> dict:
    """`PROBE` for this model: its lengths cut to the positions of a model with fewer learned ones."""
    if getattr(config, "position_embedding", None) != "learned":
        return PROBE
    lengths = ("source_length", "new_tokens", "pair_length")
    return {key: min(value, config.max_position_embeddings) if key in lengths else value
            for key, value in PROBE.items()}


def fast_cpu(model: nn.Module, plan: dict | None = None, training: bool = True) -> nn.Module:
    """`model`, in place, with the plan measured for this machine and the model's sizes (module docstring), for
    decoding and, with `training`, for training (else training stays torch's; an int8 copy's always does); or `plan`
    as given (`decoding.PLAIN`'s layout; the lean step, which plans kept before it do not name, off unless named).
    Applying it again changes nothing but a given plan."""
    check_vaswani(model, "fast_cpu")
    if plan is not None:
        if set(plan) != set(PLAIN) or any(not set(PLAIN[mode]) - {"lean"} <= set(plan[mode]) <= set(PLAIN[mode])
                                          for mode in PLAIN):
            raise ValueError(f"fast_cpu: plan must name what decoding.PLAIN names, {PLAIN}; got {plan}")
        plan = {mode: {**PLAIN[mode], **plan[mode]} for mode in PLAIN}
    bind_plan(model)
    modes = tuple(CANDIDATES) if training and not is_int8(model) else ("greedy", "beam")
    use_plan(model, plan or kept_plan(model, modes))
    for module in model.modules():  # copies packed while the plan was measured, of layers that do not pack now
        if type(module) is nn.Linear:
            PACKING.packed.pop(module, None)
    return model


def use_plan(model: nn.Module, plan: dict) -> None:
    """Decode and train `model` (transformed) as `plan` says: its linear layers are `PackedLinear` where the plan
    packs or trains in oneDNN, torch's `nn.Linear` where it does neither (whose calls cost less Python). Packed copies
    stay for the next plan that packs (the probe's candidates take turns); `fast_cpu` frees those of a final plan that
    does not."""
    model.fast_cpu_plan = plan
    packing = plan["training"]["onednn"] or plan["greedy"]["packed"] or plan["beam"]["packed"]
    for module in model.modules():
        if type(module) in (nn.Linear, PackedLinear):  # the same parameters either way
            module.__class__ = PackedLinear if packing else nn.Linear
            if packing:
                module.onednn_training = plan["training"]["onednn"]


def kept_plan(model: nn.Module, modes: tuple[str, ...]) -> dict:
    """The plan of these modes kept for this machine and the model's sizes, each mode's choice in a file of its own
    (a tool that only decodes reads the choices a training run measured); those not kept (or that cannot be read)
    measured now, together; the other modes plain."""
    listed = candidates(model)
    facts = {"cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
             "sizes": {name: getattr(model.config, name, None) for name in SIZES}, "int8": is_int8(model),
             "probe": probe(model.config), "rule": rule()}

    def measure(missing: list[str]) -> dict:
        logger.warning(f"fast_cpu: timing {', '.join(missing)} on this CPU for this model's sizes, once; kept in "
                       f"{cache_root('fast_cpu')}")
        plan, seconds = measured_plan(model, tuple(missing))
        return {mode: {"choice": plan[mode], "seconds": seconds[mode]} for mode in missing}

    by_mode = {mode: {**facts, "mode": mode, "candidates": listed[mode]} for mode in modes}
    return {**PLAIN, **kept_apart(cache_root("fast_cpu"), by_mode, "choice", measure)}


CANDIDATES = {"greedy": [{"lean": False, "packed": False}, {"lean": True, "packed": False},
                         {"lean": True, "packed": True}],
              "beam": [{"shared": False, "lean": False, "packed": False},
                       {"shared": True, "lean": False, "packed": False},
                       {"shared": True, "lean": True, "packed": False},
                       {"shared": True, "lean": True, "packed": True}],
              "training": [{"onednn": False}, {"onednn": True}]}  # each after the one without its last mechanism
# An int8 copy has no float32 weights to pack, and beams that share their source change its tokens: a last-bit
# difference in the shared keys can flip an int8 rounding of the activations after them (benchmarks/README.md).
# The lean step calls its layers on the same rows: the same tokens, bit for bit.
INT8_CANDIDATES = {"greedy": [{"lean": False, "packed": False}, {"lean": True, "packed": False}],
                   "beam": [{"shared": False, "lean": False, "packed": False},
                            {"shared": False, "lean": True, "packed": False}]}


def candidates(model: nn.Module) -> dict:
    """The plans `measured_plan` times for this model, by mode: an int8 copy's, or those this torch can run."""
    if is_int8(model):
        return INT8_CANDIDATES
    return {mode: [candidate for candidate in listed
                   if ONEDNN or not (candidate.get("packed") or candidate.get("onednn"))]
            for mode, listed in CANDIDATES.items()}


def measured_plan(model: nn.Module, modes: tuple[str, ...] = tuple(CANDIDATES)) -> tuple[dict, dict]:
    """The plan of these modes that whole calls were fastest with (greedy and beam 4 `generate()` calls, a training
    forward and backward) and each candidate's best seconds. The model's weights, gradients, mode and random state
    are left as found."""
    config, device, sizes = model.config, next(model.parameters()).device, probe(model.config)
    generator = torch.Generator().manual_seed(0)
    source = torch.randint(4, config.vocab_size, (sizes["sources"], sizes["source_length"]),
                           generator=generator).to(device)
    pairs = torch.randint(4, config.vocab_size, (2, sizes["pairs"], sizes["pair_length"]), generator=generator)
    training, candidates_by_mode = model.training, candidates(model)
    plan, seconds = {}, {}
    # Its lengths and length penalty unset while timing (a converted model's max_length, length_penalty, ...): else
    # transformers warns at each call that the probe's lengths are set too, or that greedy decoding has no penalty;
    # and its watermark, the same cost with every plan, which the paper's beam search refuses if it is SynthID's.
    decoding, model.generation_config = model.generation_config, copy.deepcopy(model.generation_config)
    model.generation_config.max_length = model.generation_config.min_length = None
    model.generation_config.length_penalty = model.generation_config.watermarking_config = None
    try:
        with torch.random.fork_rng(devices=[]):  # dropout's draws in the training probe are not the run's
            for mode in modes:
                listed = candidates_by_mode[mode]
                if mode == "training":
                    model.train()
                    timer = functools.partial(training_seconds, model, *pairs.to(device))
                else:
                    model.eval()
                    # exactly new_tokens tokens a sequence: no end of sentence before them, no early stopping
                    timer = functools.partial(generate_seconds, model, input_ids=source, generation_config=(
                        GenerationConfig(
                            num_beams=4 if mode == "beam" else 1, do_sample=False, early_stopping=False,
                            max_new_tokens=sizes["new_tokens"], min_new_tokens=sizes["new_tokens"],
                            pad_token_id=config.pad_token_id,
                            bos_token_id=config.bos_token_id, decoder_start_token_id=config.decoder_start_token_id)))
                rounds = round_seconds([functools.partial(timer, {**PLAIN, mode: candidate}) for candidate in listed])
                plan[mode] = listed[chosen(rounds)]
                seconds[mode] = [{**candidate, "seconds": min(times)} for candidate, times in zip(listed, rounds)]
    finally:
        use_plan(model, PLAIN)
        model.train(training)
        model.generation_config = decoding
    return plan, seconds


def generate_seconds(model: nn.Module, plan: dict, **inputs) -> float:
    """Seconds of one `generate(**inputs)` call under `plan`."""
    use_plan(model, plan)
    start = time.perf_counter()
    model.generate(**inputs)  # (transformers' generate() computes no gradients)
    return time.perf_counter() - start


def training_seconds(model: nn.Module, source: torch.Tensor, target: torch.Tensor, plan: dict) -> float:
    """Seconds of one forward and backward under `plan` (the gradients returned, not accumulated in the model)."""
    use_plan(model, plan)
    start = time.perf_counter()
    logits = model(input_ids=source, decoder_input_ids=target, use_cache=False).logits
    torch.autograd.grad(logits.logsumexp(-1).mean(), [p for p in model.parameters() if p.requires_grad],
                        allow_unused=True)
    return time.perf_counter() - start


def round_seconds(timers: list[Callable[[], float]]) -> list[list[float]]:
    """Each timer's seconds (its return value) in each of ROUNDS rounds in which every timer runs once, in turn and
    in reverse turn by round, after a round that warms them up (oneDNN makes its primitives, weights are packed)."""
    for timer in timers:
        timer()
    seconds = [[] for _ in timers]
    for turn in range(ROUNDS):
        for index in range(len(timers)) if turn % 2 == 0 else reversed(range(len(timers))):
            seconds[index].append(timers[index]())
    return seconds


def rule() -> dict:
    """How `chosen` judges, among the facts a choice is kept under: one made by another rule is measured again."""
    return {"rounds": ROUNDS, "margin": MARGIN, "by": "best and median of the rounds' ratios"}


def chosen(rounds: list[list[float]]) -> int:
    """The candidate to take, by index into its rounds' seconds listed as in `candidates`: each takes over from the one
    chosen so far only if it took at most MARGIN of its time both at best and by the median of the rounds' ratios
    (on a noisy machine one lucky round, or one slow round of the other, misleads either measure alone:
    benchmarks/README.md), so the plain way (index 0) stays unless a mechanism pays."""
    choice = 0
    for index in range(1, len(rounds)):
        best = min(rounds[index]) / min(rounds[choice])
        typical = statistics.median(mine / other for mine, other in zip(rounds[index], rounds[choice]))
        if max(best, typical) <= MARGIN:
            choice = index
    return choice
