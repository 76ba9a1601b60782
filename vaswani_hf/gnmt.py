# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""The paper's decoding (§6.1): "beam search with a beam size of 4 and length penalty α = 0.6 [GNMT]. We set the
maximum output length during inference to input length + 50, but terminate early when possible."

The length penalty is GNMT's (Wu et al., 2016): a hypothesis Y scores log P(Y|X) / lp(Y) with
lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the generated tokens including EOS. transformers' beam search divides
by |Y|^α instead, which is why this search exists. It follows tensor2tensor's: 2K candidates per step, the K best
that did not end stay alive, the ended ones compete for the finished slots (the best one, or the n best) by their
penalized score, and a sentence stops as soon as no alive hypothesis can beat its n-th best finished one.

A hypothesis cannot end before its first token (`min_new_tokens=1`, as fairseq's default `min_len`): an empty
translation of a non-empty source is never the answer, but a briefly trained model can score it best (an EOS
of probability 1e-3 beats a 25-token translation with log P < -18 at α = 0.6). The paper does not address it;
`min_new_tokens=0` allows empty outputs.

This file travels to the Hub beside the model: it imports only torch and transformers.
"""

import contextlib
import functools

import torch

from transformers.cache_utils import DynamicCache, EncoderDecoderCache


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α."""
    return ((5 + length) / 6) ** alpha


def with_packed_weights(search):
    """The whole search in one decoding block, where the model offers one (`packed_weights`: vaswani_hf's linear
    layers may then multiply by weights reordered once, where that is measured faster)."""

    @functools.wraps(search)
    def packed_search(model, *args, **kwargs):
        with getattr(model, "packed_weights", contextlib.nullcontext)():
            return search(model, *args, **kwargs)

    return packed_search


@torch.no_grad()
@with_packed_weights
def gnmt_beam_search(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    num_beams: int = 4,
    alpha: float = 0.6,
    max_new_tokens: int | None = None,
    extra_length: int = 50,
    min_new_tokens: int = 1,
    num_return_sequences: int = 1,
    output_scores: bool = False,
) -> torch.LongTensor | tuple[torch.LongTensor, torch.Tensor]:
    """Beam search scored with the GNMT length penalty; returns the best hypothesis of each source, or its
    `num_return_sequences` best (at most `num_beams`), best first.

    Each source's output is limited to `max_new_tokens` tokens, or, if that is None, to its own length (non-pad
    tokens) + `extra_length`. Returns (B, T) ids starting with the decoder start token, PAD after EOS — (B·n, T)
    for n > 1 hypotheses, those of a source together — and with `output_scores` also their penalized scores
    log P(Y|X) / lp(Y), (B·n,).
    """
    config = model.config
    if num_beams < 1:
        raise ValueError(f"num_beams must be >= 1, got {num_beams}")
    if not 1 <= num_return_sequences <= num_beams:
        raise ValueError(f"num_return_sequences must be between 1 and num_beams={num_beams}, got {num_return_sequences}")
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    batch_size, vocab_size, device = input_ids.shape[0], config.vocab_size, input_ids.device
    pad, eos, start = config.pad_token_id, config.eos_token_id, config.decoder_start_token_id
    limits = attention_mask.sum(-1) + extra_length if max_new_tokens is None else torch.full(
        (batch_size,), max_new_tokens, device=device)  # (B,)
    if config.position_embedding == "learned":  # no position beyond the learned ones
        limits = limits.clamp(max=config.max_position_embeddings)
    max_limit = int(limits.max())

    # One encoder row per source: the K beams of a source attend to it together (VaswaniAttention).
    encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask)  # (B, S, D)
    decoder_config = config.get_text_config(decoder=True)
    cache = EncoderDecoderCache(DynamicCache(config=decoder_config), DynamicCache(config=decoder_config))

    tokens = torch.full((batch_size * num_beams, 1), start, device=device)  # (B*K, t)
    alive_scores = torch.full((batch_size, num_beams), float("-inf"), device=device)  # log P of alive hypotheses
    alive_scores[:, 0] = 0.0  # one start hypothesis per source; the other beams fill at the first step
    n = num_return_sequences  # the n best ended hypotheses of each source, best first
    finished_scores = torch.full((batch_size, n), float("-inf"), device=device)
    finished = torch.full((batch_size, n, max_limit + 1), pad, device=device)
    finished_lengths = torch.ones(batch_size, n, dtype=torch.long, device=device)
    done = torch.zeros(batch_size, dtype=torch.bool, device=device)
    rows = torch.arange(batch_size, device=device)

    for step in range(1, max_limit + 1):  # step = |Y| of the hypotheses made in this iteration
        logits = model(
            encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_input_ids=tokens[:, -1:],
            cache=cache, use_cache=True,
        ).logits[:, -1]
        log_probs = logits.float().log_softmax(-1).view(batch_size, num_beams, vocab_size)
        if step <= min_new_tokens:
            log_probs[..., eos] = float("-inf")
        candidates = (alive_scores.unsqueeze(-1) + log_probs).view(batch_size, -1)  # (B, K*V)
        top_scores, top_index = candidates.topk(min(2 * num_beams, candidates.shape[1]), dim=-1)  # (B, 2K)
        top_beams, top_tokens = top_index // vocab_size, top_index % vocab_size

        # Hypotheses that end here (EOS, or the source's length limit) compete for the n finished slots; at equal
        # scores the earlier one keeps its slot (a stable sort, the finished ones first).
        ends = (top_tokens == eos) | (step >= limits).unsqueeze(-1)
        penalized = torch.where(ends, top_scores / gnmt_length_penalty(step, alpha), float("-inf"))  # (B, 2K)
        if ((penalized > finished_scores[:, -1:]) & ~done.unsqueeze(-1)).any():
            history = tokens.view(batch_size, num_beams, -1)[rows.unsqueeze(-1), top_beams]  # (B, 2K, t)
            ended = torch.full((*top_tokens.shape, max_limit + 1), pad, device=device)
            ended[..., :step] = history
            ended[..., step] = top_tokens
            scores, order = torch.cat([finished_scores, penalized], -1).sort(dim=-1, descending=True, stable=True)
            keep = order[:, :n].masked_fill(done.unsqueeze(-1), 0) + torch.arange(n, device=device) * done.unsqueeze(-1)
            finished = torch.cat([finished, ended], 1).gather(1, keep.unsqueeze(-1).expand(-1, -1, max_limit + 1))
            finished_scores = torch.where(done.unsqueeze(-1), finished_scores, scores[:, :n])
            finished_lengths = torch.cat([finished_lengths, torch.full_like(top_tokens, step + 1)], -1).gather(1, keep)

        # The K best hypotheses that did not end stay alive.
        alive_scores, keep = torch.where(ends, float("-inf"), top_scores).topk(num_beams, dim=-1)  # (B, K)
        parents = (rows.unsqueeze(-1) * num_beams + top_beams.gather(1, keep)).view(-1)  # (B*K,)
        tokens = torch.cat([tokens[parents], top_tokens.gather(1, keep).view(-1, 1)], dim=-1)
        # Beams never leave their source, so the cross-attention cache needs no reordering.
        cache.self_attention_cache.reorder_cache(parents)

        # Early termination: log P only falls and lp only grows up to lp(limit), so an alive hypothesis can score
        # at most its log P / lp(limit).
        best_possible = alive_scores[:, 0] / gnmt_length_penalty(limits, alpha)
        done |= (finished_scores[:, -1] >= best_possible) | (step >= limits)
        if done.all():
            break

    sequences = finished[..., : int(finished_lengths.max())]
    sequences = sequences[:, 0] if n == 1 else sequences.flatten(0, 1)
    return (sequences, finished_scores.flatten()) if output_scores else sequences


# trust_remote_code is among them: a caller may pass it to `generate` of a model loaded with it (the search is then
# already the loaded remote code).
PAPER_SEARCH_ARGUMENTS = {"input_ids", "inputs", "attention_mask", "num_beams", "max_new_tokens", "min_new_tokens",
                          "num_return_sequences", "alpha", "trust_remote_code"}
# Arguments that callers such as pipelines pass with the values the search uses anyway.
CONFIG_ECHOES = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id", "early_stopping")


def generate(*args, model, **kwargs):
    """`model.generate` of a saved model that ships this file as `custom_generate/generate.py` (loaded with
    `trust_remote_code=True`, or called with `generate(custom_generate=folder)`): the paper's beam search when the
    call asks for beam search and nothing this search does not offer; anything else (greedy, sampling, logits
    processors, output dicts, ...) goes to transformers' `generate`. The beam size and α come from the call or
    the generation config (`num_beams`, `gnmt_alpha`)."""
    given = {key: value for key, value in kwargs.items() if value is not None}
    if args:
        given.setdefault("inputs", args[0])
    config = model.generation_config
    for key in CONFIG_ECHOES:
        if key in given and given[key] == getattr(model.config, key, getattr(config, key, None)):
            del given[key]
    num_beams = given.get("num_beams") or config.num_beams or 1
    if set(given) - PAPER_SEARCH_ARGUMENTS or len(args) > 1 or num_beams == 1:
        given.pop("alpha", None)
        return type(model).generate(model, **given)
    input_ids = given.get("input_ids", given.get("inputs"))
    alpha = given.get("alpha", getattr(config, "gnmt_alpha", 0.6))
    min_new_tokens = given.get("min_new_tokens", config.min_new_tokens)
    return gnmt_beam_search(model, input_ids, given.get("attention_mask"), num_beams, alpha,
                            given.get("max_new_tokens") or config.max_new_tokens,
                            min_new_tokens=1 if min_new_tokens is None else min_new_tokens,
                            num_return_sequences=given.get("num_return_sequences") or config.num_return_sequences or 1)
