# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""The paper's decoding (§6.1): "beam search with a beam size of 4 and length penalty α = 0.6 [GNMT]. We set the
maximum output length during inference to input length + 50, but terminate early when possible." (§6.3's parser:
"input length + 300", a beam of 21, α = 0.3: a generation config's `extra_length`, `num_beams` and `gnmt_alpha`.)

The length penalty is GNMT's (Wu et al., 2016): a hypothesis Y scores log P(Y|X) / lp(Y) with
lp(Y) = ((5 + |Y|) / 6)^α, |Y| counting the generated tokens including EOS. transformers' beam search divides
by |Y|^α instead, which is why this search exists. It follows tensor2tensor's: 2K candidates per step, the K best
that did not end stay alive, the ended ones compete for the finished slots (the best one, or the n best) by their
penalized score, and a sentence stops as soon as no alive hypothesis can beat its n-th best finished one. As there,
a hypothesis still alive at the length limit is cut and returned only where fewer than n ended with EOS: it fills
the slots they left, after them. Unlike there, a sentence that stopped leaves the batch, as in fairseq's search: the
later steps compute only the others, and each sentence's outputs are what it gets decoded alone.

With one beam the search is greedy, as tensor2tensor decodes then: the most probable token at each step, no
second candidate that ends kept aside.

A hypothesis cannot end before its first token (`min_new_tokens=1`, as fairseq's default `min_len`): an empty
translation of a non-empty source is never the answer, but a briefly trained model can score it best (an EOS
of probability 1e-3 beats a 25-token translation with log P < -18 at α = 0.6). The paper does not address it;
`min_new_tokens=0` allows empty outputs.

`paper_decoding` is what `VaswaniForConditionalGeneration.generate()` runs: this search where the generation
config asks for it (`gnmt_alpha`, which training/run.py saves beside `num_beams`), a one-line refusal of what the call
asks of it that it does not take, transformers' `generate()` for another decoding named in the call. This file
travels to the Hub beside the model: it imports only torch and transformers.
"""

import copy
import itertools
import math
import numbers
import time

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteriaList
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.generation import SynthIDTextWatermarkingConfig
from transformers.generation.utils import GenerateBeamEncoderDecoderOutput
from transformers.integrations.deepspeed import is_deepspeed_zero3_enabled
from transformers.integrations.fsdp import is_fsdp_managed_module
from transformers.modeling_outputs import BaseModelOutput

from .checks import check_token_ids

# §6.1: "We set the maximum output length during inference to input length + 50".
EXTRA_OUTPUT_LENGTH = 50


def extra_length_of(generation_config) -> int:
    """How far past its source's length an output of the paper's decoding may run: the generation config's
    `extra_length`, else §6.1's 50."""
    extra_length = getattr(generation_config, "extra_length", None)
    return EXTRA_OUTPUT_LENGTH if extra_length is None else extra_length


def gnmt_length_penalty(length: int | torch.Tensor, alpha: float) -> float | torch.Tensor:
    """lp(Y) = ((5 + |Y|) / 6)^α."""
    return ((5 + length) / 6) ** alpha


@torch.no_grad()
def gnmt_beam_search(
    model,
    input_ids: torch.LongTensor,
    attention_mask: torch.Tensor | None = None,
    num_beams: int = 4,
    alpha: float = 0.6,
    *,
    max_new_tokens: int | None = None,
    extra_length: int = EXTRA_OUTPUT_LENGTH,
    min_new_tokens: int = 1,
    num_return_sequences: int = 1,
    output_scores: bool = False,
    synced_gpus: bool = False,
    logits_processor: LogitsProcessorList | None = None,
    decoder_input_ids: torch.LongTensor | None = None,
    max_time: float | None = None,
    stopping_criteria: StoppingCriteriaList | None = None,
    encoder_outputs: BaseModelOutput | tuple | None = None,
) -> torch.LongTensor | tuple[torch.LongTensor, torch.Tensor]:
    """Beam search scored with the GNMT length penalty; returns the best hypothesis of each source, or its
    `num_return_sequences` best (at most `num_beams`), best first.

    Each source's output is limited to `max_new_tokens` tokens, or, if that is None, to its own length (non-pad tokens)
    + `extra_length`. Returns (B, T) ids starting with the decoder start token, PAD after EOS — (B·n, T) for n > 1
    hypotheses, those of a source together — and with `output_scores` also their penalized scores log P(Y|X) / lp(Y),
    (B·n,). `synced_gpus`: every process of a sharded model (FSDP, DeepSpeed ZeRO-3), whose forward gathers weights
    from all, calls the model at each step until all processes are done, as transformers' `synced_gpus` does.
    `logits_processor`: transformers' processors (no repeated n-grams, banned words, a prefix function, ...), applied
    to each step's log-probabilities (with one beam to its logits, as transformers' greedy search applies them), which
    are then normalized again (as transformers' `renormalize_logits` does: a hypothesis's log P only falls, which the
    early stop relies on); the sources then stay in the batch until all are done, as the processors may read its
    layout. `decoder_input_ids`: each output's beginning, (B, P), the decoder start token first (transformers' decoder
    prompt): the search continues it, and counts, scores and limits only the tokens it adds, as transformers' beam
    search does. `max_time`: seconds from the search's start after which the step under way is every source's last,
    as transformers' `max_time` ends its beam search: its candidates compete for the finished slots as at a length
    limit. `stopping_criteria`: transformers' criteria (stop strings, ...), asked of each step's 2K candidates (B·2K
    rows, the beginning and start token included), as its beam search asks them: a candidate they stop has ended, as
    one that ends with EOS; the sources then stay in the batch, as with processors. `encoder_outputs`: the sources
    encoded already (transformers' input of that name, `encoding_of`), read with `attention_mask` as they are, in
    place of encoding `input_ids` (then unread: None will do).
    """
    config = model.config
    if encoder_outputs is None:
        check_token_ids(input_ids, config.vocab_size, "input_ids", values=False)  # the encoder reads the values
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        elif attention_mask.shape == input_ids.shape:  # (else the encoder's one-line error)
            input_ids, attention_mask = right_padded(input_ids, attention_mask)
    else:
        encoded, attention_mask = encoding_of(encoder_outputs, attention_mask, config.d_model)
    check_whole("num_beams", num_beams, 1)
    check_whole("min_new_tokens", min_new_tokens, 0)
    check_whole("num_return_sequences", num_return_sequences, 1)
    if max_new_tokens is not None:
        check_whole("max_new_tokens (max_length counts the decoder start token)", max_new_tokens, 1)
    check_whole("extra_length", extra_length, 0)
    check_alpha("gnmt_alpha", alpha)  # the early stop below relies on lp growing with length, as it does for α >= 0
    if max_time is not None:
        check_alpha("max_time", max_time)
        deadline = time.monotonic() + max_time
    if not 1 <= num_return_sequences <= num_beams:
        raise ValueError(
            f"num_return_sequences must be between 1 and num_beams={num_beams}, got {num_return_sequences}"
        )
    source = input_ids if encoder_outputs is None else encoded  # (B, S) ids or (B, S, D) states
    batch_size, vocab_size, device = source.shape[0], config.vocab_size, source.device
    if decoder_input_ids is not None:
        check_token_ids(decoder_input_ids, config.vocab_size, "decoder_input_ids")
        if decoder_input_ids.shape[0] != batch_size:
            raise ValueError(f"decoder_input_ids has {decoder_input_ids.shape[0]} rows for {batch_size} "
                             "sources: give one beginning per source")
    pad, eos, start = config.pad_token_id, config.eos_token_id, config.decoder_start_token_id
    eos_ids = eos if isinstance(eos, list) else [eos]
    if len(eos_ids) != 1 or eos_ids[0] is None:  # tensor2tensor's search, like the paper's models, ends at one token
        raise ValueError(f"the paper's search ends hypotheses at one eos_token_id, the model has {eos!r}: set one, "
                         "or pass gnmt_alpha=None for transformers' beam search")
    eos = eos_ids[0]
    limits = output_limits(config, attention_mask, max_new_tokens, extra_length)  # (B,)
    max_limit = int(limits.max())

    # The source encoded once, its output repeated for each of its K beams, as transformers' beam search does.
    if encoder_outputs is None:
        encoded = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    encoder_outputs = BaseModelOutput(last_hidden_state=encoded)  # (B, S, D), not the caller's: the search changes it
    if num_beams > 1:  # greedy: the rows as they are, no copy
        encoder_outputs.last_hidden_state = encoded.repeat_interleave(num_beams, 0)
        attention_mask = attention_mask.repeat_interleave(num_beams, 0)  # (B*K, S)
    decoder_config = config.get_text_config(decoder=True)
    cache = EncoderDecoderCache(DynamicCache(config=decoder_config), DynamicCache(config=decoder_config))
    cache.self_attention_cache.layers = [BeamLayer() for _ in cache.self_attention_cache.layers]

    if decoder_input_ids is None:
        decoder_input_ids = torch.full((batch_size, 1), start, device=device)
    begun = decoder_input_ids.shape[1]  # the start token and the outputs' given beginning
    tokens = decoder_input_ids.repeat_interleave(num_beams, 0)  # (B*K, begun + t - 1)
    alive_scores = torch.full((batch_size, num_beams), float("-inf"), device=device)  # log P of alive hypotheses
    alive_scores[:, 0] = 0.0  # one start hypothesis per source; the other beams fill at the first step
    n = num_return_sequences  # the n best ended hypotheses of each source, best first
    finished_scores = torch.full((batch_size, n), float("-inf"), device=device)
    finished = torch.full((batch_size, n, begun + max_limit), pad, device=device)
    finished_lengths = torch.full((batch_size, n), begun, device=device)
    finished_stopped = torch.zeros(batch_size, n, dtype=torch.bool, device=device)  # ended by EOS or a criterion
    rows = torch.arange(batch_size, device=device)
    sources = rows  # the index in the batch given of each source still searched
    searched = batch_size  # how many
    output = tuple(torch.empty_like(t) for t in (finished, finished_scores, finished_lengths))  # filled as sources end

    for step in itertools.count(1):  # step = |Y| of the hypotheses made in this iteration
        decoded = step > max_limit or not searched
        if synced_gpus:
            everywhere = torch.tensor(float(decoded), device=device)
            torch.distributed.all_reduce(everywhere, op=torch.distributed.ReduceOp.MIN)
            if everywhere.item():
                break
            if decoded:  # in step with the others, to no effect here
                model(encoder_outputs=encoder_outputs, attention_mask=attention_mask, decoder_input_ids=tokens[:, :1])
                continue
        elif decoded:
            break
        logits = model(
            encoder_outputs=encoder_outputs, attention_mask=attention_mask,
            decoder_input_ids=tokens[:, -1:] if step > 1 else tokens, cache=cache, use_cache=True,
        ).logits[:, -1]
        on_logits = logits_processor and num_beams == 1  # as transformers' greedy search; its beam search: log P
        log_probs = logits.float() if on_logits else logits.float().log_softmax(-1)
        if logits_processor:
            log_probs = processed(logits_processor, tokens, log_probs)
        log_probs = log_probs.view(batch_size, num_beams, vocab_size)
        if step <= min_new_tokens:
            log_probs[..., eos] = float("-inf")
        candidates = (alive_scores.unsqueeze(-1) + log_probs).view(batch_size, -1)  # (B, K*V)
        width = 2 * num_beams if num_beams > 1 else 1  # one beam: greedy, the most probable token alone
        top_scores, top_index = candidates.topk(min(width, candidates.shape[1]), dim=-1)  # (B, 2K)
        top_beams, top_tokens = top_index // vocab_size, top_index % vocab_size
        if max_time is not None and time.monotonic() > deadline:  # this step ends every hypothesis
            limits = limits.clamp(max=step)

        # Hypotheses that end here (EOS or a stopping criterion, or the source's length limit) compete for the n
        # finished slots: those stopped (not cut) first, then by penalized score; at equal scores the earlier one
        # keeps its slot (stable sorts, the finished ones first).
        history = tokens.view(batch_size, num_beams, -1)[rows.unsqueeze(-1), top_beams]  # (B, 2K, begun + t - 1)
        stopped = top_tokens == eos
        if stopping_criteria:  # as transformers' beam search asks them: of every candidate's tokens, scores unkept
            candidate_tokens = torch.cat([history, top_tokens.unsqueeze(-1)], -1).flatten(0, 1)
            stopped |= stopping_criteria(candidate_tokens, None).view(stopped.shape)
        stopped &= top_scores.isfinite()  # (not the -inf candidates of empty beams)
        ends = stopped | (step >= limits).unsqueeze(-1)
        penalized = torch.where(ends, top_scores / gnmt_length_penalty(step, alpha), float("-inf"))  # (B, 2K)
        if (penalized > finished_scores[:, -1:]).any():
            ended = torch.full((*top_tokens.shape, begun + max_limit), pad, device=device)
            ended[..., : begun + step - 1] = history
            ended[..., begun + step - 1] = top_tokens
            scores, order = torch.cat([finished_scores, penalized], -1).sort(dim=-1, descending=True, stable=True)
            stopped_first = torch.cat([finished_stopped, stopped], -1).gather(1, order).sort(
                dim=-1, descending=True, stable=True).indices
            scores, order = scores.gather(1, stopped_first), order.gather(1, stopped_first)
            keep = order[:, :n]
            finished = torch.cat([finished, ended], 1).gather(1, keep.unsqueeze(-1).expand(-1, -1, begun + max_limit))
            finished_scores = scores[:, :n]
            added = torch.full_like(top_tokens, begun + step)
            finished_lengths = torch.cat([finished_lengths, added], -1).gather(1, keep)
            finished_stopped = torch.cat([finished_stopped, stopped], -1).gather(1, keep)

        # The K best hypotheses that did not end stay alive.
        alive_scores, keep = torch.where(ends, float("-inf"), top_scores).topk(num_beams, dim=-1)  # (B, K)
        parents = rows.unsqueeze(-1) * num_beams + top_beams.gather(1, keep)  # (B, K) rows of this step
        next_tokens = top_tokens.gather(1, keep)  # (B, K)

        # Early termination: log P only falls and lp only grows up to lp(limit), so an alive hypothesis can score
        # at most its log P / lp(limit).
        best_possible = alive_scores[:, 0] / gnmt_length_penalty(limits, alpha)
        done = (finished_scores[:, -1] >= best_possible) | (step >= limits)
        searched = batch_size - int(done.sum())

        # A source that is done leaves the batch, its n best hypotheses kept (as fairseq's search does): the later
        # steps compute only the sources still searched. With processors or stopping criteria, which may read the
        # batch's layout, it stays in the batch: its alive hypotheses can no longer win (at its limit none is alive).
        if 0 < searched < batch_size and not logits_processor and not stopping_criteria:
            for kept, value in zip(output, (finished, finished_scores, finished_lengths)):
                kept[sources[done]] = value[done]
            stay = (~done).nonzero().squeeze(1)
            sources, parents, next_tokens, alive_scores, limits = (
                t[stay] for t in (sources, parents, next_tokens, alive_scores, limits))
            finished, finished_scores, finished_lengths, finished_stopped = (
                t[stay] for t in (finished, finished_scores, finished_lengths, finished_stopped))
            encoder_outputs.last_hidden_state = encoder_outputs.last_hidden_state[rows_of(stay, num_beams)]
            attention_mask = attention_mask[rows_of(stay, num_beams)]
            keep_sources(cache.cross_attention_cache, stay, batch_size)
            batch_size = len(stay)
            rows = torch.arange(batch_size, device=device)
        tokens = torch.cat([tokens[parents.view(-1)], next_tokens.view(-1, 1)], dim=-1)
        # Beams never leave their source, so the cross-attention cache needs no reordering.
        cache.self_attention_cache.reorder_cache(parents.view(-1))

    for kept, value in zip(output, (finished, finished_scores, finished_lengths)):
        kept[sources] = value
    finished, finished_scores, finished_lengths = output
    if logits_processor and not finished_scores[:, 0].isfinite().all():  # they banned a source's every hypothesis
        empty = int((~finished_scores[:, 0].isfinite()).nonzero()[0, 0])
        raise ValueError(f"the logits processors leave source {empty} of the batch no hypothesis: they ban every "
                         "continuation of its beams")
    sequences = finished[..., : int(finished_lengths.max())]
    sequences = sequences[:, 0] if n == 1 else sequences.flatten(0, 1)
    return (sequences, finished_scores.flatten()) if output_scores else sequences


class BeamLayer(DynamicLayer):
    """transformers' `DynamicLayer` for the search's self-attention cache, copied once a step where it was copied
    twice: reordering the beams writes the entries into a tensor one position longer (`index_select`), whose last
    position the next `update` fills, where `torch.cat` copied them all again. In between, `keys` and `values` are
    views of the reordered entries; after anything else that replaces them, `update` grows them as transformers'
    layer does."""

    room = viewed = None  # (keys, values) one position longer; the views of them that `keys` and `values` were given

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        if self.get_seq_length() > 0:
            self.room = tuple(reordered_with_room(t, beam_idx.to(t.device)) for t in (self.keys, self.values))
            self.keys, self.values = self.viewed = tuple(t[..., :-1, :] for t in self.room)

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        room, viewed, self.room, self.viewed = self.room, self.viewed, None, None
        if (room is None or self.keys is not viewed[0] or self.values is not viewed[1]
                or key_states.shape[-2] != 1 or key_states.shape[0] != room[0].shape[0]):
            return super().update(key_states, value_states, *args, **kwargs)
        for grown, new in zip(room, (key_states, value_states)):
            grown[..., -1:, :] = new
        self.keys, self.values = room
        return self.keys, self.values


def reordered_with_room(states: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """The rows `order` of `states` (B, h, t, d) in a new (len(order), h, t + 1, d) tensor, its last position empty."""
    room = states.new_empty(len(order), states.shape[1], states.shape[2] + 1, states.shape[3])
    torch.index_select(states, 0, order, out=room[..., :-1, :])
    return room


def processed(logits_processor: LogitsProcessorList, tokens: torch.Tensor, log_probs: torch.Tensor) -> torch.Tensor:
    """A step's log-probabilities (B', V) after transformers' processors, normalized again; a row whose every token
    they ban is -inf (a beam that ends nowhere), not NaN."""
    return logits_processor(tokens, log_probs).log_softmax(-1).nan_to_num(-math.inf, neginf=-math.inf)


def encoding_of(encoder_outputs, attention_mask: torch.Tensor | None,
                d_model: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The sources' encoding that transformers' `encoder_outputs` holds (a `BaseModelOutput`, or a tuple, the last
    hidden states first), (B, S, d_model), and its padding mask, (B, S): `attention_mask`, or ones; else a one-line
    ValueError."""
    held = isinstance(encoder_outputs, (tuple, BaseModelOutput))  # as the model reads them: not a tensor alone
    states = encoder_outputs[0] if held else encoder_outputs
    shape = tuple(states.shape) if held and torch.is_tensor(states) else None
    if shape is None or len(shape) != 3 or shape[-1] != d_model or 0 in shape:
        got = type(states).__name__ if shape is None else f"shape {shape}"
        raise ValueError(f"encoder_outputs must hold the encoder's last hidden states, (batch, length, {d_model}), "
                         f"first: got {got}")
    if attention_mask is None:
        attention_mask = torch.ones(states.shape[:2], dtype=torch.long, device=states.device)
    if attention_mask.shape != states.shape[:2]:
        raise ValueError(f"attention_mask has shape {tuple(attention_mask.shape)} but encoder_outputs needs "
                         f"{tuple(states.shape[:2])}: one entry per source token, 1 for tokens and 0 for padding")
    return states, attention_mask


def right_padded(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each source's tokens (ids, (B, S), or embeddings, (B, S, D)) moved, in order, before its padding: a tokenizer
    with `padding_side="left"` would start a sentence's positions (§3.5) after its padding, and its translation would
    change with the batch's longest."""
    order = (attention_mask == 0).int().argsort(dim=-1, stable=True)
    moved = order.view(*order.shape, *[1] * (input_ids.dim() - 2)).expand(*order.shape, *input_ids.shape[2:])
    return input_ids.gather(1, moved), attention_mask.gather(1, order)


def rows_of(sources: torch.Tensor, per_source: int) -> torch.Tensor:
    """The rows of `sources` in a batch of `per_source` consecutive rows a source."""
    return (sources.unsqueeze(-1) * per_source + torch.arange(per_source, device=sources.device)).view(-1)


def keep_sources(cache: DynamicCache, stay: torch.Tensor, sources: int) -> None:
    """The cache's rows of the sources at `stay` (of `sources`), one row or one per beam each (speed/attention.py's
    layout and the search's)."""
    if cache.get_seq_length() > 0:
        cache.batch_select_indices(rows_of(stay, cache.layers[0].keys.shape[0] // sources))


def output_limits(config, attention_mask: torch.Tensor, max_new_tokens: int | None,
                  extra_length: int = EXTRA_OUTPUT_LENGTH) -> torch.Tensor:
    """The most tokens each source's output may have, (B,): `max_new_tokens`, or the source's length (non-pad
    tokens) + `extra_length`; never past the learned positions."""
    limits = attention_mask.sum(-1) + extra_length if max_new_tokens is None else torch.full(
        attention_mask.shape[:1], max_new_tokens, device=attention_mask.device)
    if config.position_embedding == "learned":
        limits = limits.clamp(max=config.max_position_embeddings)
    return limits


@torch.no_grad()
def each_step(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, sequences: torch.Tensor,
              limits: torch.Tensor, scores: bool, logits: bool, attentions: bool, hidden_states: bool,
              logits_processor: LogitsProcessorList | None = None, begun: int = 1,
              stopping_criteria: StoppingCriteriaList | None = None, encoder_outputs=None) -> dict:
    """What transformers' beam search returns step by step (as `GenerateBeamEncoderDecoderOutput` names it), for
    the n hypotheses per source the search returned (`sequences`, B·n rows), the model reading each hypothesis
    whole (teacher-forced): `beam_indices`, each generated token's row, its own, or -1 after the hypothesis
    ended (at its EOS or where the search's `stopping_criteria` stopped it, or cut at its source's limit); with
    `scores` each step's log-probabilities over the vocabulary, (B·n, V) a step, which `compute_transition_scores`
    reads (with `logits_processor`, built for n rows a source, processed and normalized again as the search had
    them); with `logits` the logits; with `attentions` each step's weights of every layer (`decoder_attentions`
    (B·n, h, 1, t), `cross_attentions` (B·n, h, 1, S)) and the encoder's (`encoder_attentions`, B rows); with
    `hidden_states` each step's hidden states of every layer, and the encoder's. Attention weights come from the
    eager kernel, as in transformers' own decoding. `begun`: the tokens each hypothesis began with (the start token,
    and a given beginning), which the first step reads at once, as transformers' first step reads a decoder prompt.
    `encoder_outputs`: the search's, a `BaseModelOutput` (`gnmt_beam_search`), whose attentions and hidden states are
    returned as given, as transformers' beam search returns them."""
    if encoder_outputs is None:
        encoder_outputs = model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask,
                                              output_attentions=attentions, output_hidden_states=hidden_states)
    n = sequences.shape[0] // attention_mask.shape[0]
    out = model(encoder_outputs=(encoder_outputs.last_hidden_state.repeat_interleave(n, 0),),
                attention_mask=attention_mask.repeat_interleave(n, 0), decoder_input_ids=sequences[:, :-1],
                use_cache=False, output_attentions=attentions, output_hidden_states=hidden_states)
    generated, first = sequences[:, begun:], begun - 1  # first: the position whose logits make the first token
    positions = torch.arange(generated.shape[1], device=generated.device)
    steps = range(generated.shape[1])
    stops = generated == model.config.eos_token_id
    if stopping_criteria:
        stops |= torch.stack([stopping_criteria(sequences[:, : begun + t + 1], None) for t in steps], 1)
    first_stop = torch.where(stops, positions, generated.shape[1]).amin(-1)
    lengths = torch.minimum(first_stop + 1, limits.repeat_interleave(n))
    rows = torch.arange(sequences.shape[0], device=generated.device).unsqueeze(-1).expand_as(generated)
    found = {"beam_indices": rows.masked_fill(positions >= lengths.unsqueeze(-1), -1)}
    read = [slice(0 if t == 0 else first + t, first + t + 1) for t in steps]  # the positions each step reads
    if scores:
        found["scores"] = out.logits[:, first:].float().log_softmax(-1).unbind(1)
        if logits_processor:
            found["scores"] = tuple(processed(logits_processor, sequences[:, : begun + t], found["scores"][t])
                                    for t in steps)
    if logits:
        found["logits"] = out.logits[:, first:].unbind(1)
    if attentions:
        found["encoder_attentions"] = encoder_outputs.attentions
        found["decoder_attentions"] = tuple(
            tuple(layer[:, :, read[t], : begun + t] for layer in out.decoder_attentions) for t in steps)
        found["cross_attentions"] = tuple(tuple(layer[:, :, read[t]] for layer in out.cross_attentions)
                                          for t in steps)
    if hidden_states:
        found["encoder_hidden_states"] = encoder_outputs.hidden_states
        found["decoder_hidden_states"] = tuple(tuple(layer[:, read[t]] for layer in out.decoder_hidden_states)
                                               for t in steps)
    return found


def logits_processors(model, config: GenerationConfig, source: torch.Tensor | None, inputs: dict, rows: int,
                      limits: torch.Tensor, begun: int = 1) -> LogitsProcessorList:
    """transformers' logits processors that `config`'s `PROCESSOR_SETTINGS` and the call's `PROCESSOR_INPUTS` ask for,
    built as its `generate()` builds them for a beam search of the encoder-decoder's `source` (None: given encoded,
    read by no `SOURCE_SETTINGS`), `rows` rows a source (beams, or the hypotheses returned); `forced_eos_token_id` at
    each source's own limit (`limits`, (B,): the tokens added to the `begun` each output begins with, the start token
    among them), as `ForcedEndAtLimit`."""
    check_beam_processors(config, rows)
    taken = {key: getattr(config, key) for key in PROCESSOR_SETTINGS if key != "forced_eos_token_id"}
    settings = GenerationConfig(num_beams=rows, num_return_sequences=rows, **taken,
                                **{key: getattr(model.config, key) for key in TOKEN_SETTINGS})
    model._prepare_special_tokens(settings, True, limits.device)
    processors = model._get_logits_processor(
        settings, input_ids_seq_length=begun, encoder_input_ids=source, device=limits.device, model_kwargs={},
        prefix_allowed_tokens_fn=inputs.get("prefix_allowed_tokens_fn"),
        logits_processor=inputs.get("logits_processor"))
    if config.forced_eos_token_id is not None:
        processors.append(ForcedEndAtLimit((limits + begun - 1).repeat_interleave(rows), config.forced_eos_token_id))
    return processors


def check_beam_processors(config: GenerationConfig, beams: int) -> None:
    """A one-line ValueError for a processor of `config` that a search of `beams` > 1 beams cannot apply: SynthID's
    watermark (made for sampling) keeps each row's past from step to step, and the beams change rows."""
    if beams > 1 and isinstance(config.watermarking_config, SynthIDTextWatermarkingConfig):
        raise ValueError("SynthID's watermarking_config keeps each row's past from step to step, which the paper's "
                         "beam search reorders: leave it out, or sample (do_sample=True)")


def stopping_criteria_of(model, config: GenerationConfig, inputs: dict) -> StoppingCriteriaList | None:
    """transformers' stopping criteria that `config`'s `stop_strings` (read with the call's `tokenizer`) and the call's
    `stopping_criteria` ask for, built as its `generate()` builds them, but for its length, time and EOS criteria:
    those are the search's own limits. None where there are none."""
    if config.stop_strings is None and not inputs.get("stopping_criteria"):
        return None
    settings = GenerationConfig(stop_strings=config.stop_strings)
    settings._eos_token_tensor = None  # (what `_prepare_special_tokens` sets): EOS ends hypotheses in the search
    return model._get_stopping_criteria(settings, inputs.get("stopping_criteria") or StoppingCriteriaList(),
                                        tokenizer=inputs.get("tokenizer"))


class ForcedEndAtLimit(LogitsProcessor):
    """transformers' `ForcedEOSTokenLogitsProcessor` at each row's own limit (`limits`, (rows,): the most tokens it
    may hold after the start token) where transformers' has one for all: its last token is one of `token_ids`."""

    def __init__(self, limits: torch.Tensor, token_ids: int | list[int]):
        self.limits, self.token_ids = limits, token_ids

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        last = input_ids.shape[-1] >= self.limits  # t tokens, the start token among them, make the t-th token
        forced = torch.full_like(scores, -math.inf)
        forced[:, self.token_ids] = 0.0
        return torch.where(last.unsqueeze(-1), forced, scores)


def check_whole(name: str, value, least: int) -> None:
    """A one-line ValueError unless `value` is a whole number (not a bool) of at least `least`."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be a whole number of at least {least}, got {value!r}")


def check_alpha(name: str, value) -> None:
    """A one-line ValueError unless `value` is a finite number (not a bool) of at least 0: a GNMT α, a time."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 <= value < math.inf:
        raise ValueError(f"{name} must be a finite number of at least 0, got {value!r}")


# What the search takes of a generation config or a call: a saved config's or the call's own (other than None or
# False). max_length and min_length count the decoder start token, as transformers' do for encoder-decoder models.
SEARCH_SETTINGS = ("num_beams", "gnmt_alpha", "extra_length", "max_new_tokens", "max_length", "min_new_tokens",
                   "min_length", "num_return_sequences", "early_stopping", "use_cache", "max_time",
                   "return_dict_in_generate", "output_scores", "output_logits", "output_attentions",
                   "output_hidden_states", "transformers_version")
# What `return_dict_in_generate` returns step by step, each asked for by its `output_*` setting (`each_step`).
STEP_OUTPUTS = ("scores", "logits", "attentions", "hidden_states")
TOKEN_SETTINGS = ("pad_token_id", "eos_token_id", "bos_token_id", "decoder_start_token_id")  # must be the model's
# Settings and inputs that name another decoding: a call with one of them is that decoding, transformers' own.
OTHER_DECODINGS = ("do_sample", "length_penalty", "num_beam_groups", "diversity_penalty", "penalty_alpha",
                   "constraints", "force_words_ids", "prompt_lookup_num_tokens", "custom_generate", "assistant_model")
# Settings and inputs that make transformers' logits processors, which the search applies as its beam search does.
PROCESSOR_SETTINGS = ("repetition_penalty", "encoder_repetition_penalty", "no_repeat_ngram_size",
                      "encoder_no_repeat_ngram_size", "bad_words_ids", "sequence_bias", "suppress_tokens",
                      "begin_suppress_tokens", "forced_bos_token_id", "renormalize_logits", "remove_invalid_values",
                      "exponential_decay_length_penalty", "watermarking_config", "forced_eos_token_id")
PROCESSOR_INPUTS = ("logits_processor", "prefix_allowed_tokens_fn")
SOURCE_SETTINGS = ("encoder_repetition_penalty", "encoder_no_repeat_ngram_size")  # processors that read the source
# A setting and inputs that make transformers' stopping criteria, which the search asks as its beam search does.
STOPPING_SETTINGS, STOPPING_INPUTS = ("stop_strings",), ("stopping_criteria", "tokenizer")
# Inputs no decoding reads: transformers' generate never forwards `labels` (Seq2SeqTrainer passes the references).
UNREAD_INPUTS = ("labels",)


def paper_decoding(model, generate, inputs=None, generation_config=None, **kwargs):
    """`model.generate(inputs, generation_config, **kwargs)`, where `generate` is transformers' own.

    A generation config (the model's, or the one given on top of the model's) or a call with `gnmt_alpha` asks for the
    paper's decoding (§6.1): with `num_beams` > 1 this GNMT search, source length + `extra_length` tokens (50 unless
    set) unless `max_new_tokens` or `max_length` says otherwise, its result a tensor or, with
    `return_dict_in_generate`, a `GenerateBeamEncoderDecoderOutput`; with `output_scores` it holds the penalized scores
    (`sequences_scores`) and what `compute_transition_scores` reads (each token's log-probability); with
    `output_logits`, `output_attentions`, `output_hidden_states` those of each step (`each_step`). transformers' logits
    processors (`PROCESSOR_SETTINGS`, `PROCESSOR_INPUTS`: no repeated n-grams, banned words, ...) apply to its
    log-probabilities, as in transformers' beam search, `forced_eos_token_id` at each source's own limit;
    `decoder_input_ids` (with a `decoder_attention_mask` of ones, or none) begin the outputs, as transformers' decoder
    prompt does; `max_time` ends it, and stopping criteria (`stop_strings` with a `tokenizer`, `stopping_criteria`)
    end hypotheses, as in transformers' beam search; `encoder_outputs` are read with their mask as given, in place of
    encoding the sources, and `inputs_embeds` encoded, right-padded as ids are. The search is never swapped for another
    behind the call's back: a setting or input it does not take (streamers, ...) is refused in one line naming it; one
    that names another decoding (`OTHER_DECODINGS`: sampling, transformers' `length_penalty`, ...), `gnmt_alpha=None`
    or one beam (greedy: the same tokens) is transformers' decoding of it, at most source length + `extra_length`
    tokens unless the call sets a length. `labels` are not read and `synced_gpus` is transformers' (Seq2SeqTrainer
    passes both). Without `gnmt_alpha` in the generation config or the call, transformers' decoding unchanged: an
    `extra_length` in the call is refused. The paper's decoding reads left-padded sources right-padded
    (`right_padded`).
    """
    config = copy.deepcopy(generation_config if generation_config is not None else model.generation_config)
    if generation_config is not None:  # as transformers merges them: the model's entries fill what is unset
        config.update(**model.generation_config.to_dict(), defaults_only=True, allow_custom_entries=True)
    configs_alpha = getattr(config, "gnmt_alpha", None)
    alpha = kwargs.pop("gnmt_alpha", configs_alpha)
    extra_length = kwargs.pop("extra_length", None)
    inputs_of_call = config.update(**kwargs)
    if alpha is None and configs_alpha is None:
        if extra_length is not None:
            raise ValueError("generate(): extra_length limits the paper's decoding (gnmt_alpha), which this call does "
                             "not ask for: give transformers' decoding max_new_tokens")
        return generate(inputs, generation_config=generation_config, **kwargs)
    if extra_length is None:
        extra_length = extra_length_of(config)
    check_whole("generate(): extra_length", extra_length, 0)
    if config.num_beams is not None:
        check_whole("generate(): num_beams", config.num_beams, 1)
    source = inputs if inputs is not None else inputs_of_call.get("input_ids")
    mask, encoded = inputs_of_call.get("attention_mask"), inputs_of_call.get("encoder_outputs")
    if isinstance(encoded, tuple):  # (last hidden states, ...) as the model takes them; transformers' decoding too
        encoded = kwargs["encoder_outputs"] = BaseModelOutput(*encoded)
    embeds = inputs_of_call.pop("inputs_embeds", None)
    if encoded is None and embeds is not None:  # encoded here, as transformers' generate encodes them, right-padded
        if torch.is_tensor(embeds) and torch.is_tensor(mask) and mask.shape == embeds.shape[:2]:
            embeds, mask = right_padded(embeds, mask)
        with torch.no_grad():
            encoded = model.get_encoder()(inputs_embeds=embeds, attention_mask=mask)
        kwargs.update(encoder_outputs=encoded, attention_mask=mask)  # what the call gives, and transformers' decoding
        inputs_of_call.update(encoder_outputs=encoded, attention_mask=mask)
        del kwargs["inputs_embeds"]
    if encoded is not None:  # read as given, with its mask
        mask = encoding_of(encoded, mask, model.config.d_model)[1]
    elif torch.is_tensor(source) and torch.is_tensor(mask) and source.dim() == 2 and mask.shape == source.shape:
        source, mask = right_padded(source, mask)
    defaults, plain = GenerationConfig._get_default_generation_params(), GenerationConfig()
    # transformers' `from_pretrained(folder, dropout=0.2)` copies the model config's keyword arguments into the loaded
    # generation config too: those are the model's (its config's alone), not settings of its decoding.
    saved = {key for key, value in config.to_diff_dict().items()
             if value is not None and value is not False and value != defaults.get(key)
             and (hasattr(plain, key) or not hasattr(model.config, key))}
    given = {key for key, value in kwargs.items()
             if key not in inputs_of_call and value is not None and value is not False}
    other_settings = {key for key in saved | given if key not in SEARCH_SETTINGS + TOKEN_SETTINGS and key[0] != "_"}
    processed = other_settings & set(PROCESSOR_SETTINGS) | {key for key in PROCESSOR_INPUTS if inputs_of_call.get(key)}
    synced_gpus = inputs_of_call.pop("synced_gpus", None)
    if synced_gpus is None:  # transformers' default: processes of a sharded model step together
        synced_gpus = (is_deepspeed_zero3_enabled() or is_fsdp_managed_module(model)) and (
            torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1)
    other_inputs = {key for key, value in inputs_of_call.items() if value is not None} - {
        "input_ids", "attention_mask", "decoder_input_ids", "encoder_outputs", *UNREAD_INPUTS}
    prompt, prompt_mask = inputs_of_call.get("decoder_input_ids"), inputs_of_call.get("decoder_attention_mask")
    shaped = torch.is_tensor(prompt) and torch.is_tensor(prompt_mask) and prompt_mask.shape == prompt.shape
    if shaped and prompt_mask.all():  # the outputs' given beginnings, none padded: it changes nothing
        other_inputs.discard("decoder_attention_mask")
    papers = alpha is not None and not (other_settings | other_inputs) & set(OTHER_DECODINGS)  # else transformers'
    if papers and source is None and other_settings & set(SOURCE_SETTINGS):  # (given encoded; greedy would ignore it)
        raise ValueError(f"generate(): {', '.join(sorted(other_settings & set(SOURCE_SETTINGS)))} reads the sources' "
                         "input_ids, which this call does not give: pass them beside the encoding, or leave it out")
    if papers and (config.num_beams or 1) > 1:
        refused = sorted(other_settings - set(PROCESSOR_SETTINGS + STOPPING_SETTINGS)
                         | other_inputs - set(PROCESSOR_INPUTS + STOPPING_INPUTS) | {
            key for key in TOKEN_SETTINGS if getattr(config, key) not in (None, getattr(model.config, key))})
        if encoded is None and (not torch.is_tensor(source) or source.dim() != 2):
            refused.append("inputs other than a (batch, length) tensor of token ids")
        if prompt is not None and not (torch.is_tensor(prompt) and prompt.dim() == 2):
            refused.append("decoder_input_ids other than a (batch, length) tensor of token ids")
        if refused:
            saved_only = [f"{key}=None" for key in refused if key in saved - given]  # a converted model's, ...
            drop = f" (the generation config's: pass {', '.join(saved_only)})" if saved_only else ""
            instead = ("num_beams=1, which streams (transformers streams no beam search)" if "streamer" in refused else
                       "gnmt_alpha=None for transformers' beam search (log P / |Y|^length_penalty)")
            raise ValueError(f"generate(): the paper's beam search (gnmt_alpha={alpha}) does not take "
                             f"{', '.join(refused)}: leave it out{drop}, or pass {instead}")
        start = model.config.decoder_start_token_id
        if prompt is not None and prompt.shape[1] and (prompt[:, 0] != start).all():  # as transformers: put first
            prompt = torch.cat([prompt.new_full((prompt.shape[0], 1), start), prompt], dim=-1)
        begun = 1 if prompt is None else prompt.shape[1]  # the tokens each output begins with, the start token's too
        max_new_tokens = config.max_new_tokens
        if max_new_tokens is None and "max_length" in saved | given:
            max_new_tokens = config.max_length - begun  # max_length counts them
        min_new_tokens = 1 if config.min_new_tokens is None else config.min_new_tokens
        if "min_length" in saved | given:  # so does min_length
            min_new_tokens = max(min_new_tokens, config.min_length - begun)
        n = 1 if config.num_return_sequences is None else config.num_return_sequences
        mask = torch.ones_like(source) if mask is None else mask
        limits = output_limits(model.config, mask, max_new_tokens, extra_length)
        criteria = stopping_criteria_of(model, config, inputs_of_call)
        sequences, scores = gnmt_beam_search(
            model, source, mask, config.num_beams, alpha, max_new_tokens=max_new_tokens, extra_length=extra_length,
            min_new_tokens=min_new_tokens, num_return_sequences=n, stopping_criteria=criteria, encoder_outputs=encoded,
            output_scores=True, synced_gpus=synced_gpus, max_time=config.max_time,
            logits_processor=logits_processors(model, config, source, inputs_of_call, config.num_beams, limits, begun)
            if processed else None, decoder_input_ids=prompt)
        if not config.return_dict_in_generate:
            return sequences
        wanted = {key: bool(getattr(config, f"output_{key}")) for key in STEP_OUTPUTS}
        if not any(wanted.values()):
            return GenerateBeamEncoderDecoderOutput(sequences=sequences)
        processors = (logits_processors(model, config, source, inputs_of_call, n, limits, begun)
                      if processed and wanted["scores"] else None)
        found = each_step(model, source, mask, sequences, limits, **wanted, logits_processor=processors, begun=begun,
                          stopping_criteria=criteria, encoder_outputs=encoded)
        return GenerateBeamEncoderDecoderOutput(sequences=sequences, **found,
                                                sequences_scores=scores if wanted["scores"] else None)
    if (torch.is_tensor(source) or encoded is not None) and config.max_new_tokens is None and (
            "max_length" not in saved | given):
        source_length = int(mask.sum(-1).max()) if torch.is_tensor(mask) and mask.dim() == 2 else source.shape[-1]
        kwargs["max_new_tokens"] = source_length + extra_length
    if papers and config.min_new_tokens is None:
        kwargs["min_new_tokens"] = 1  # one beam of the search: greedy, as the search ends no output before a token
    if papers and torch.is_tensor(mask):  # the sources right-padded, as the search reads them
        kwargs["attention_mask"] = mask
        if inputs is None:
            kwargs["input_ids"] = source
        else:
            inputs = source
    return generate(inputs, generation_config=generation_config, **kwargs)
