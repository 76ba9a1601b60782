"""generate(): the paper's defaults, the cache, and equivalences between decoding paths (§6.1)."""

import contextlib
import copy
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from forked import run_forked, torch_ranks
from support import BOS, EOS, PAD, random_ids, tiny_model
from transformers import AttentionInterface, DynamicCache, EncoderDecoderCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.modeling_outputs import BaseModelOutput

from vaswani_hf import fast_cpu
from vaswani_hf.gnmt import gnmt_beam_search, gnmt_length_penalty
from vaswani_hf.speed.attention import attention_modules, swap
from vaswani_hf.speed.decoding import PLAIN


def padded_sources():
    """Three sources of lengths 7, 4 and 6, right-padded."""
    source = random_ids(3, 7, seed=11)
    mask = torch.ones_like(source)
    for row, length in enumerate((7, 4, 6)):
        source[row, length:], mask[row, length:] = PAD, 0
    return source, mask


def strip(tokens: torch.Tensor) -> list[int]:
    """A hypothesis up to and including its EOS."""
    tokens = tokens.tolist()
    return tokens[: tokens.index(EOS) + 1] if EOS in tokens else tokens


GREEDY = {"num_beams": 1, "max_new_tokens": 12}
BEAM_4 = {"num_beams": 4, "max_new_tokens": 12}


@pytest.mark.parametrize("decoding", [GREEDY, BEAM_4], ids=["greedy", "beam 4"])
def test_with_and_without_cache_give_identical_tokens(trained_model, decoding):
    source, mask = padded_sources()
    cached = trained_model.generate(source, attention_mask=mask, use_cache=True, **decoding)
    uncached = trained_model.generate(source, attention_mask=mask, use_cache=False, **decoding)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize("decoding", [GREEDY, BEAM_4], ids=["greedy", "beam 4"])
def test_batched_and_one_at_a_time_give_identical_tokens(trained_model, decoding):
    source, mask = padded_sources()
    batched = trained_model.generate(source, attention_mask=mask, **decoding)
    for row in range(3):
        length = int(mask[row].sum())
        alone = trained_model.generate(source[row : row + 1, :length], **decoding)
        assert strip(batched[row]) == strip(alone[0])


def test_decoding_paths_make_real_choices(trained_model):
    """Guard for the tests above: the toy model's outputs differ between sentences and end with EOS."""
    source, mask = padded_sources()
    out = trained_model.generate(source, attention_mask=mask, **GREEDY)
    hypotheses = [strip(row) for row in out]
    assert len({tuple(h) for h in hypotheses}) == 3 and all(h[-1] == EOS for h in hypotheses)
    assert all(len(set(h)) > 3 for h in hypotheses)


def test_a_model_from_a_bare_config_decodes_with_transformers_defaults():
    """As every transformers model: greedy, at most 20 new tokens (transformers' global defaults), nothing of ours."""
    model = tiny_model()
    config = model.generation_config
    assert (config.num_beams, getattr(config, "gnmt_alpha", None)) == (None, None)
    assert (config.decoder_start_token_id, config.pad_token_id, config.eos_token_id) == (BOS, PAD, EOS)
    source = random_ids(2, 6)
    never_ends = {"bad_words_ids": [[EOS]]}
    out = model.generate(source, **never_ends)
    assert out.shape[1] == 1 + 20 and (out[:, 0] == BOS).all()
    assert torch.equal(out, model.generate(source, num_beams=1, do_sample=False, max_new_tokens=20, **never_ends))


def test_a_generation_config_with_gnmt_alpha_decodes_the_papers_way():
    """`gnmt_alpha` in the generation config (as training/run.py saves it) makes generate() the GNMT search, beam
    size and α from the config, source length + 50; a call may set them, or ask for transformers' decodings."""
    model = tiny_model()
    source, mask = padded_sources()
    model.generation_config.num_beams, model.generation_config.gnmt_alpha = 3, 1.4
    paper = gnmt_beam_search(model, source, mask, num_beams=3, alpha=1.4)
    assert torch.equal(model.generate(source, attention_mask=mask), paper)
    echoes = {"early_stopping": True, "pad_token_id": PAD, "output_scores": False}  # as pipelines pass them
    assert torch.equal(model.generate(input_ids=source, attention_mask=mask, **echoes), paper)
    assert torch.equal(model.generate(source, attention_mask=mask, num_beams=2, gnmt_alpha=0.2),
                       gnmt_beam_search(model, source, mask, num_beams=2, alpha=0.2))
    two = model.generate(source, attention_mask=mask, num_return_sequences=2, max_new_tokens=4)
    assert torch.equal(two, gnmt_beam_search(model, source, mask, 3, 1.4, max_new_tokens=4, num_return_sequences=2))
    # Settings the search does not offer: transformers' decoding of them.
    greedy = model.generate(source, attention_mask=mask, num_beams=1, max_new_tokens=9)
    assert torch.equal(greedy, tiny_model().generate(source, attention_mask=mask, max_new_tokens=9))
    transformers_beam = model.generate(source, attention_mask=mask, length_penalty=0.5, max_new_tokens=9)
    assert torch.equal(transformers_beam, tiny_model().generate(source, attention_mask=mask, num_beams=3,
                                                                length_penalty=0.5, max_new_tokens=9))
    # A bare config asks for the paper's search in the call.
    assert torch.equal(tiny_model().generate(source, attention_mask=mask, num_beams=3, gnmt_alpha=1.4), paper)


def test_the_papers_search_returns_a_beam_output_and_its_scores_and_honours_max_length():
    """return_dict_in_generate: transformers' beam output class holding the search's sequences and, with
    output_scores, its penalized scores (`sequences_scores`); asking for them changes no token. max_length counts the
    decoder start token, as transformers' does."""
    from transformers.generation.utils import GenerateBeamEncoderDecoderOutput

    model = tiny_model()
    model.generation_config.num_beams, model.generation_config.gnmt_alpha = 3, 1.4
    source, mask = padded_sources()
    paper, scores = gnmt_beam_search(model, source, mask, 3, 1.4, num_return_sequences=2, output_scores=True)
    out = model.generate(source, attention_mask=mask, num_return_sequences=2, output_scores=True,
                         return_dict_in_generate=True)
    assert isinstance(out, GenerateBeamEncoderDecoderOutput)
    assert torch.equal(out.sequences, paper) and torch.equal(out.sequences_scores, scores)
    assert model.generate(source, attention_mask=mask, return_dict_in_generate=True).sequences_scores is None
    assert torch.equal(model.generate(source, attention_mask=mask, max_length=5),
                       gnmt_beam_search(model, source, mask, 3, 1.4, max_new_tokens=4))


@pytest.mark.parametrize(("trained", "limit"), [(True, None), (False, None), (False, 60)],
                         ids=["ended by EOS", "cut at each source's limit", "cut at max_new_tokens"])
def test_the_papers_search_gives_compute_transition_scores_each_tokens_log_probability(trained_model, trained, limit):
    """With output_scores, transformers' `compute_transition_scores(sequences, scores, beam_indices)` reads the
    search's output as it reads its own beam search's: the transitions of each returned hypothesis add up to the
    log P(Y|X) that the search divided by lp(|Y|) (its `sequences_scores`), over its |Y| tokens, 0 after them. The
    trained model ends its hypotheses with EOS; the untrained one never does: they are cut at their sources' limits
    (lengths 7, 4, 6, + 50: the shorter ones padded to the longest), or all at max_new_tokens."""
    model = trained_model if trained else tiny_model()
    source, mask = padded_sources()
    out = model.generate(source, attention_mask=mask, num_beams=3, gnmt_alpha=1.4, num_return_sequences=2,
                         max_new_tokens=limit, output_scores=True, return_dict_in_generate=True)
    generated = out.sequences[:, 1:]
    ends = generated == EOS
    limits = torch.tensor([57, 57, 54, 54, 56, 56] if limit is None else [limit] * 6)
    lengths = torch.where(ends.any(-1), ends.int().argmax(-1) + 1, limits)
    assert ends.any(-1).all() if trained else generated.shape[1] == limits.max() and not ends.any()
    transitions = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    assert transitions.shape == generated.shape and not transitions.requires_grad
    assert not transitions[torch.arange(generated.shape[1]) >= lengths.unsqueeze(-1)].any()
    torch.testing.assert_close(transitions.sum(-1) / gnmt_length_penalty(lengths, 1.4), out.sequences_scores,
                               rtol=1e-5, atol=0)


@pytest.mark.parametrize("shared", [False, True], ids=["plain", "beams sharing their source (fast_cpu)"])
def test_the_papers_search_gives_each_steps_attentions_hidden_states_and_logits_as_transformers_lays_them_out(
        trained_model, shared):
    """output_attentions, output_hidden_states, output_logits: the search's output holds them in the layout of
    transformers' beam search (a tuple over steps of tuples over layers; the encoder's once, a row per source), and
    for each returned hypothesis, at each of its steps (`beam_indices`: its own row until it ends), what the model
    computes decoding that hypothesis step by step with its cache, as transformers' decoding runs it. The tokens are
    those asked for without them. Also where fast_cpu lets a source's 3 beams share it: the pass over the 2 returned
    hypotheses per source reads each row."""
    plain = copy.deepcopy(trained_model)
    plain.set_attn_implementation("eager")  # the weights come from the eager kernel, as in transformers' decoding
    model = fast_cpu(copy.deepcopy(plain), {**PLAIN, "beam": {"shared": True, "lean": False, "packed": False}}) \
        if shared else plain
    source, mask = padded_sources()
    asked = {"output_attentions": True, "output_hidden_states": True, "output_logits": True,
             "return_dict_in_generate": True, "num_beams": 3, "num_return_sequences": 2}
    out = model.generate(source, attention_mask=mask, gnmt_alpha=1.4, **asked)
    assert torch.equal(out.sequences, model.generate(source, attention_mask=mask, gnmt_alpha=1.4, num_beams=3,
                                                     num_return_sequences=2))
    theirs = model.generate(source, attention_mask=mask, max_new_tokens=12, **asked)  # transformers' beam search
    steps, rows = out.sequences.shape[1] - 1, out.sequences.shape[0]
    for name in ("encoder_attentions", "encoder_hidden_states"):
        assert [t.shape for t in getattr(out, name)] == [t.shape for t in getattr(theirs, name)]
    for name in ("decoder_attentions", "cross_attentions", "decoder_hidden_states"):
        ours, transformers_ = getattr(out, name), getattr(theirs, name)
        assert len(ours) == steps and {len(step) for step in ours} == {len(transformers_[0])}
        assert [t.shape[1:] for t in ours[1]] == [t.shape[1:] for t in transformers_[1]]  # past the rows: the same
    encoder = plain.get_encoder()(input_ids=source, attention_mask=mask, output_attentions=True,
                                  output_hidden_states=True)
    torch.testing.assert_close(out.encoder_attentions, encoder.attentions)
    torch.testing.assert_close(out.encoder_hidden_states, encoder.hidden_states)
    for row in range(rows):
        cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
        for step in range(steps):
            if out.beam_indices[row, step] < 0:  # the hypothesis ended
                break
            assert out.beam_indices[row, step] == row
            decoded = plain(input_ids=source[row // 2 : row // 2 + 1], attention_mask=mask[row // 2 : row // 2 + 1],
                            decoder_input_ids=out.sequences[row : row + 1, step : step + 1], cache=cache,
                            use_cache=True, output_attentions=True, output_hidden_states=True)
            for name, expected in (("decoder_attentions", decoded.decoder_attentions),
                                   ("cross_attentions", decoded.cross_attentions),
                                   ("decoder_hidden_states", decoded.decoder_hidden_states)):
                torch.testing.assert_close(tuple(layer[row : row + 1] for layer in getattr(out, name)[step]),
                                           expected, msg=f"{name}, row {row}, step {step}")
            torch.testing.assert_close(out.logits[step][row : row + 1], decoded.logits[:, -1])


def test_left_padded_sources_decode_in_the_papers_decoding_as_right_padded_ones(trained_model):
    """A tokenizer with `padding_side="left"` puts each row's padding first. The paper's decoding reads a source's
    tokens from its row's start, so that the positions (§3.5) count from its sentence's first token, not from the
    batch's longest: the beam search, its scores and one beam give what the right-padded batch gives."""
    source, mask = padded_sources()
    pads = (mask == 0).sum(-1, keepdim=True)
    order = (torch.arange(source.shape[1]) - pads) % source.shape[1]  # each row's padding moved first
    left, left_mask = source.gather(1, order), mask.gather(1, order)
    assert (left_mask[:, -1] == 1).all() and (left_mask[1, :3] == 0).all()
    paper = {"num_beams": 3, "gnmt_alpha": 0.6}
    assert torch.equal(trained_model.generate(left, attention_mask=left_mask, **paper),
                       trained_model.generate(source, attention_mask=mask, **paper))
    assert torch.equal(gnmt_beam_search(trained_model, left, left_mask), gnmt_beam_search(trained_model, source, mask))
    scored = {**paper, "num_return_sequences": 2, "output_scores": True, "return_dict_in_generate": True}
    out = trained_model.generate(input_ids=left, attention_mask=left_mask, **scored)
    expected = trained_model.generate(input_ids=source, attention_mask=mask, **scored)
    torch.testing.assert_close((out.sequences_scores, out.scores), (expected.sequences_scores, expected.scores))
    greedy = {"num_beams": 1, "gnmt_alpha": 0.6}
    assert torch.equal(trained_model.generate(left, attention_mask=left_mask, **greedy),
                       trained_model.generate(source, attention_mask=mask, **greedy))


def test_min_length_counts_the_decoder_start_token_in_the_papers_search_as_in_transformers():
    """A model that would end every output at once: `min_length=4` lets EOS come 4 positions in, after 3 tokens, in
    the paper's search as in transformers' beam search; with `min_new_tokens` the larger holds, as both of
    transformers' processors would."""
    model = tiny_model(add_final_logits_bias=True)
    model.final_logits_bias[..., EOS] = 100.0  # EOS first, wherever allowed
    source, mask = padded_sources()
    paper, transformers_beam = {"num_beams": 3, "gnmt_alpha": 0.6}, {"num_beams": 3, "max_new_tokens": 9}
    for settings, generated in (({"min_length": 4}, 3), ({"min_length": 4, "min_new_tokens": 5}, 5),
                                ({"min_length": 1, "min_new_tokens": 0}, 0)):
        ours = model.generate(source, attention_mask=mask, **paper, **settings)
        theirs = model.generate(source, attention_mask=mask, **transformers_beam, **settings)
        assert (ours[:, 1 + generated] == EOS).all() and (ours[:, 1 : 1 + generated] != EOS).all()
        assert (theirs[:, 1 + generated] == EOS).all(), settings


def test_the_papers_search_stops_at_the_last_learned_position():
    """12 learned positions: the untrained model's hypotheses, which never end, are cut at 12 tokens (their sources'
    lengths + 50 would be 54 to 57), not an IndexError past the last position; their scores too."""
    model = tiny_model(position_embedding="learned", max_position_embeddings=12)
    source, mask = padded_sources()
    out = model.generate(source, attention_mask=mask, num_beams=3, gnmt_alpha=0.6, output_scores=True,
                         return_dict_in_generate=True)
    assert out.sequences.shape == (3, 13) and len(out.scores) == 12 and (out.beam_indices >= 0).all()


@pytest.mark.parametrize("processed", [False, True])
def test_max_time_makes_the_step_under_way_every_sources_last_as_a_length_limit_does(monkeypatch, processed):
    """A clock that moves a second each time it is read (at the search's start, then once a step): with max_time 2.5
    the third step is the last, and generate() gives what max_new_tokens=3 gives (a source that ends sooner as it
    ends): the hypotheses, their scores and the per-step outputs, with transformers' processors too. max_time 0 on the
    real clock ends the search at its first step; a negative one is one line."""
    from types import SimpleNamespace

    from vaswani_hf import gnmt

    model = tiny_model()
    source, mask = padded_sources()
    common = {"attention_mask": mask, "num_beams": 3, "gnmt_alpha": 0.6, "num_return_sequences": 2,
              "output_scores": True, "return_dict_in_generate": True,
              **({"no_repeat_ngram_size": 2} if processed else {})}
    expected = model.generate(source, max_new_tokens=3, **common)
    ticks = iter(range(100))
    with monkeypatch.context() as patch:
        patch.setattr(gnmt, "time", SimpleNamespace(monotonic=lambda: float(next(ticks))))
        found = model.generate(source, max_time=2.5, **common)
    assert torch.equal(found.sequences, expected.sequences) and found.sequences.shape[1] == 4
    torch.testing.assert_close(found.sequences_scores, expected.sequences_scores)
    assert torch.equal(found.beam_indices, expected.beam_indices)
    torch.testing.assert_close(found.scores, expected.scores)
    first = model.generate(source, attention_mask=mask, num_beams=3, gnmt_alpha=0.6, max_time=0.0)
    assert torch.equal(first, model.generate(source, attention_mask=mask, num_beams=3, gnmt_alpha=0.6,
                                             max_new_tokens=1))
    with pytest.raises(ValueError, match=r"^max_time must be a finite number of at least 0, got -1\.0$"):
        model.generate(source, attention_mask=mask, num_beams=3, gnmt_alpha=0.6, max_time=-1.0)


@pytest.mark.parametrize("num_beams", [1, 3])
def test_given_encoder_outputs_decode_as_the_sources_they_encode(num_beams):
    """transformers' `encoder_outputs`: the sources encoded already, read with their mask in place of encoding the
    call's input_ids (other sources here). The paper's search (its n best, what each step returns, the encoder's
    attentions and hidden states as given) and its greedy decoding give what the sources encoded give, from a
    `BaseModelOutput` or a tuple, with input_ids or without, through generate() or gnmt_beam_search."""
    model = tiny_model(attn_implementation="eager")
    model.generation_config.update(num_beams=num_beams, gnmt_alpha=0.6, allow_custom_entries=True)
    source, mask = padded_sources()
    encoded = model.get_encoder()(input_ids=source, attention_mask=mask, output_attentions=True,
                                  output_hidden_states=True)
    wanted = {"num_return_sequences": num_beams, "return_dict_in_generate": True, "output_scores": True,
              "output_logits": True, "output_attentions": True, "output_hidden_states": True}
    expected, others = model.generate(source, attention_mask=mask, **wanted), random_ids(3, 7, seed=12)
    searched = gnmt_beam_search(model, source, mask, num_beams, 0.6, num_return_sequences=num_beams)  # (its limits)
    assert not torch.equal(model.generate(others, attention_mask=mask), expected.sequences[::num_beams])
    for given in (encoded, encoded.to_tuple()):
        found = model.generate(others, attention_mask=mask, encoder_outputs=given, **wanted)
        assert torch.equal(found.sequences, expected.sequences) and found.keys() == expected.keys()
        for key in found.keys() - {"sequences", "cache"}:
            torch.testing.assert_close(found[key], expected[key], msg=key)
        alone = model.generate(encoder_outputs=given, attention_mask=mask, num_return_sequences=num_beams)
        assert torch.equal(alone, expected.sequences)
        assert torch.equal(gnmt_beam_search(model, None, mask, num_beams, 0.6, encoder_outputs=given,
                                            num_return_sequences=num_beams), searched)
    # Left-padded as given: attention reads a set of positions, so the states moved with their mask decode the same.
    left_mask, left_states = moved_left(mask, encoded.last_hidden_state)
    assert left_mask[1].tolist() == [0, 0, 0, 1, 1, 1, 1]
    left = model.generate(others, attention_mask=left_mask, encoder_outputs=(left_states,),
                          num_return_sequences=num_beams)
    assert torch.equal(left, expected.sequences)


def moved_left(mask: torch.Tensor, *batches: torch.Tensor) -> list[torch.Tensor]:
    """A right-padded batch's mask and `batches` (ids, embeddings, states: a row per source) left-padded: each row's
    entries moved, in order, after its padding."""
    shifts = (mask == 0).sum(-1).tolist()
    return [torch.stack([row.roll(shift, 0) for row, shift in zip(t, shifts, strict=True)]) for t in (mask, *batches)]


@pytest.mark.parametrize("num_beams", [1, 3])
def test_inputs_embeds_decode_as_the_ids_whose_embedding_rows_they_are(num_beams):
    """transformers' `inputs_embeds`: rows of the embedding matrix (`get_input_embeddings()`'s), encoded in place of
    ids and, left-padded, right-padded first as ids are. The paper's search (its n best, each step's scores) and its
    greedy decoding give what the ids give."""
    model = tiny_model()
    model.generation_config.update(num_beams=num_beams, gnmt_alpha=0.6, allow_custom_entries=True)
    source, mask = padded_sources()
    wanted = {"num_return_sequences": num_beams, "return_dict_in_generate": True, "output_scores": True}
    expected = model.generate(source, attention_mask=mask, **wanted)
    embeds = model.get_input_embeddings()(source).detach()
    for given_mask, given in ((mask, embeds), moved_left(mask, embeds)):
        found = model.generate(inputs_embeds=given, attention_mask=given_mask, **wanted)
        assert torch.equal(found.sequences, expected.sequences)
        torch.testing.assert_close(found.scores, expected.scores)
        theirs = {"num_beams": 2, "length_penalty": 1.0}  # transformers' beam search: the same encoding read
        assert torch.equal(model.generate(inputs_embeds=given, attention_mask=given_mask, **theirs),
                           model.generate(inputs_embeds=embeds, attention_mask=mask, **theirs))


NOT_STATES = "encoder_outputs must hold the encoder's last hidden states, (batch, length, 24), first: got "


@pytest.mark.parametrize(("given", "message"), [
    ({"encoder_outputs": (torch.zeros(3, 7),)}, NOT_STATES + "shape (3, 7)"),
    ({"encoder_outputs": BaseModelOutput(last_hidden_state=torch.zeros(3, 7, 8))}, NOT_STATES + "shape (3, 7, 8)"),
    ({"encoder_outputs": [torch.zeros(3, 7, 24)]}, NOT_STATES + "list"),
    ({"encoder_outputs": torch.zeros(3, 7, 24)}, NOT_STATES + "Tensor"),
    ({"encoder_outputs": (torch.zeros(3, 7, 24),), "attention_mask": torch.ones(3, 6)},
     "attention_mask has shape (3, 6) but encoder_outputs needs (3, 7): one entry per source token, 1 for tokens"),
    ({"inputs_embeds": torch.zeros(3, 7, 8)}, "inputs_embeds must have shape (batch, length >= 1, d_model=24)"),
    ({"inputs_embeds": torch.zeros(3, 7, 24), "attention_mask": torch.ones(3, 6)}, "attention_mask has shape (3, 6)"),
    ({"encoder_outputs": (torch.zeros(3, 7, 24),), "encoder_no_repeat_ngram_size": 2},
     "generate(): encoder_no_repeat_ngram_size reads the sources' input_ids, which this call does not give: pass"),
], ids=["2 dimensions", "not d_model", "a list", "a tensor alone", "its mask", "embeddings not d_model",
        "the embeddings' mask", "a processor reading the source"])
@pytest.mark.parametrize("num_beams", [1, 3])
def test_encodings_that_the_paper_decoding_cannot_read_are_refused_in_one_line(given, message, num_beams):
    """Before any decoding, for the search and for its one beam (transformers' greedy decoding, which would only warn
    that it ignores a processor reading the source ids)."""
    model = tiny_model()
    model.generation_config.update(num_beams=num_beams, gnmt_alpha=0.6, allow_custom_entries=True)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        model.generate(**given)


@pytest.mark.parametrize(("option", "named"), [
    ({"top_k": 5}, "top_k"),
    ({"eos_token_id": 5}, "eos_token_id"),
])
def test_what_the_papers_search_does_not_take_is_refused_in_one_line_not_sent_elsewhere(option, named):
    """Before, such a call went to transformers' beam search, with its length penalty, and the tokens changed without
    a word. gnmt_alpha=None in the call is transformers' beam search, as for a model saved without it."""
    model = tiny_model()
    model.generation_config.num_beams, model.generation_config.gnmt_alpha = 3, 1.4
    source, mask = padded_sources()
    message = f"generate(): the paper's beam search (gnmt_alpha=1.4) does not take {named}: leave it out, or pass "
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):
        model.generate(source, attention_mask=mask, **option)
    plain = tiny_model()
    plain.generation_config.num_beams = 3
    transformers_beam = model.generate(source, attention_mask=mask, gnmt_alpha=None, max_new_tokens=6, **option)
    assert torch.equal(transformers_beam, plain.generate(source, attention_mask=mask, max_new_tokens=6, **option))


def test_a_streamer_is_refused_by_the_papers_search_and_streams_the_one_beam_the_message_names():
    """transformers streams no beam search: the refusal names the call that streams (one beam, transformers' greedy
    decoding), whose streamed tokens are its output's."""
    from transformers.generation.streamers import BaseStreamer

    class Kept(BaseStreamer):
        def __init__(self):
            self.tokens = []

        def put(self, value):
            self.tokens += value.reshape(-1).tolist()

        def end(self):
            pass

    model = tiny_model()
    model.generation_config.num_beams, model.generation_config.gnmt_alpha = 3, 1.4
    source, _ = padded_sources()
    message = ("generate(): the paper's beam search (gnmt_alpha=1.4) does not take streamer: leave it out, or pass "
               "num_beams=1, which streams (transformers streams no beam search)")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        model.generate(source[:1], streamer=Kept())
    kept = Kept()
    output = model.generate(source[:1], streamer=kept, num_beams=1)
    assert kept.tokens == output[0].tolist()  # the start token, then each step's


def test_the_papers_search_refuses_a_source_that_is_not_a_batch_of_token_ids_in_one_line():
    model = tiny_model()
    model.generation_config.num_beams, model.generation_config.gnmt_alpha = 3, 1.4
    source, _ = padded_sources()
    message = "does not take inputs other than a (batch, length) tensor of token ids: leave it out"
    with pytest.raises(ValueError, match=re.escape(message)):
        model.generate(source[0])


def test_the_papers_output_length_is_source_length_plus_50_unless_set():
    model = tiny_model()
    model.generation_config.gnmt_alpha = 0.6
    source, mask = padded_sources()  # longest source: 7 tokens
    never_ends = {"num_beams": 1, "bad_words_ids": [[EOS]]}
    assert model.generate(source, attention_mask=mask, **never_ends).shape[1] == 1 + 7 + 50
    assert model.generate(source, attention_mask=mask, max_new_tokens=5, **never_ends).shape[1] == 1 + 5
    assert model.generate(source, attention_mask=mask, max_length=9, **never_ends).shape[1] == 9


def test_extra_length_sets_how_far_past_its_source_an_output_may_run():
    """§6.3's parser decodes up to input length + 300: `extra_length` in the generation config (as training/run.py
    saves it) or in the call, for the paper's search and for transformers' decoding of its greedy calls; each source's
    own limit in a batch, and for transformers' beam search that `gnmt_alpha=None` names. Without the paper's decoding
    in the generation config or the call it is refused, not ignored."""
    model = tiny_model(add_final_logits_bias=True)
    with torch.no_grad():
        model.final_logits_bias[0, EOS] = -1e9  # no hypothesis ever ends
    model.generation_config.num_beams, model.generation_config.gnmt_alpha = 3, 0.3
    model.generation_config.extra_length = 300
    source, mask = padded_sources()  # sources of 7, 4 and 6 tokens
    out = model.generate(source, attention_mask=mask)
    assert out.shape[1] == 1 + 7 + 300 and [int(row.ne(PAD).sum()) - 1 for row in out] == [307, 304, 306]
    assert model.generate(source, attention_mask=mask, extra_length=2).shape[1] == 1 + 7 + 2
    assert model.generate(source, attention_mask=mask, num_beams=1).shape[1] == 1 + 7 + 300
    assert model.generate(source, attention_mask=mask, num_beams=1, extra_length=0).shape[1] == 1 + 7
    with pytest.raises(ValueError, match=r"^generate\(\): extra_length must be a whole number of at least 0, got -1$"):
        model.generate(source, attention_mask=mask, extra_length=-1)
    # gnmt_alpha=None: transformers' beam search, limited as the model's decoding is (not at transformers' 20 tokens).
    assert model.generate(source, attention_mask=mask, gnmt_alpha=None).shape[1] == 1 + 7 + 300
    assert model.generate(source, attention_mask=mask, gnmt_alpha=None, extra_length=2).shape[1] == 1 + 7 + 2
    with pytest.raises(ValueError, match=r"^generate\(\): extra_length limits the paper's decoding \(gnmt_alpha\)"):
        tiny_model().generate(source, attention_mask=mask, extra_length=300)


def test_sampling_is_reproducible_and_assisted_decoding_matches_greedy(trained_model):
    source, mask = padded_sources()
    samples = []
    for _ in range(2):
        torch.manual_seed(0)
        samples.append(trained_model.generate(source, attention_mask=mask, do_sample=True, top_k=5, **GREEDY))
    assert torch.equal(*samples)
    assistant = tiny_model(seed=5)  # a poor assistant: most of its proposals are rejected
    for row in range(3):  # transformers' assisted decoding takes one sequence at a time
        one = source[row : row + 1, : int(mask[row].sum())]
        greedy = trained_model.generate(one, **GREEDY)
        assert torch.equal(trained_model.generate(one, assistant_model=assistant, **GREEDY), greedy)


def test_the_cache_is_an_encoder_decoder_cache_with_one_layer_per_decoder_layer(trained_model):
    source, mask = padded_sources()
    out = trained_model.generate(source, attention_mask=mask, return_dict_in_generate=True, **GREEDY)
    cache = out.cache
    assert isinstance(cache, EncoderDecoderCache)
    c = trained_model.config
    assert len(cache.self_attention_cache.layers) == len(cache.cross_attention_cache.layers) == c.num_decoder_layers
    generated = out.sequences.shape[1]
    assert cache.self_attention_cache.layers[0].keys.shape == (3, c.num_heads, generated - 1, c.d_k)
    assert cache.cross_attention_cache.layers[0].values.shape == (3, c.num_heads, 7, c.d_v)


@pytest.mark.parametrize("decoding", [GREEDY, BEAM_4], ids=["greedy", "beam 4"])
def test_cross_attention_keys_and_values_are_computed_once_per_generate(trained_model, decoding):
    source, mask = padded_sources()
    calls = []
    hooks = [
        layer.encoder_attn.k_proj.register_forward_hook(lambda *_: calls.append(1))
        for layer in trained_model.model.decoder.layers
    ]
    try:
        out = trained_model.generate(source, attention_mask=mask, **decoding)
    finally:
        for hook in hooks:
            hook.remove()
    assert out.shape[1] > 3 and len(calls) == trained_model.config.num_decoder_layers


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_beams_sharing_their_source_compute_what_the_model_file_computes(implementation):
    """fast_cpu's encoder-decoder attention with 4 beams per source (`FastAttention.group`) computes the keys and
    values of one row per source and folds the beams into one block of queries: the logits and attention weights
    are the plain model's over the encoder output repeated for every beam, as generate() lays it out."""
    plain = tiny_model(seed=2)
    plain.set_attn_implementation(implementation)
    sharing = copy.deepcopy(plain)
    for module in attention_modules(sharing, cross_only=True):
        swap(module).group = 4
    source, mask = padded_sources()
    encoder_states = plain.get_encoder()(input_ids=source, attention_mask=mask).last_hidden_state  # (3, 7, D)
    inputs = {"encoder_outputs": BaseModelOutput(last_hidden_state=encoder_states.repeat_interleave(4, 0)),
              "attention_mask": mask.repeat_interleave(4, 0), "decoder_input_ids": random_ids(12, 5, seed=4),
              "output_attentions": implementation == "eager"}
    rows = []
    hook = sharing.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[0]))
    shared, repeated = sharing(**inputs), plain(**inputs)
    hook.remove()
    assert rows == [3]
    torch.testing.assert_close(shared.logits, repeated.logits)
    if implementation == "eager":
        for ours, reference in zip(shared.cross_attentions, repeated.cross_attentions, strict=True):
            torch.testing.assert_close(ours, reference)


def assert_same_cache(cache: EncoderDecoderCache, reference: EncoderDecoderCache):
    for part in ("self_attention_cache", "cross_attention_cache"):
        for layer, expected in zip(getattr(cache, part).layers, getattr(reference, part).layers, strict=True):
            torch.testing.assert_close(layer.keys, expected.keys, msg=part)
            torch.testing.assert_close(layer.values, expected.values, msg=part)


def in_repeated_layout(model):
    """A plain copy of `model`, not transformed: its beams attend to the encoder output repeated once per beam, as
    transformers lays it out."""
    plain = tiny_model()  # the trained model's configuration
    plain.load_state_dict(model.state_dict())
    return plain


@pytest.fixture
def sharing_model(trained_model):
    """A copy of the trained model transformed by `fast_cpu` with a plan that shares sources and packs nothing (beams
    share their source's keys and values in generate()): only the layout differs from the plain model's."""
    return fast_cpu(copy.deepcopy(trained_model), {**PLAIN, "beam": {"shared": True, "packed": False}})


def test_beam_search_computes_one_encoder_row_per_source_and_returns_transformers_layout(sharing_model):
    """Within generate() the cross-attention keys and values are computed once per source (3 rows, not 12); the
    beams, scores and the returned cache are those of transformers' repeated layout, one row per sequence."""
    source, mask = padded_sources()
    decoding = {**BEAM_4, "num_return_sequences": 2, "return_dict_in_generate": True, "output_scores": True}
    rows = []
    hook = sharing_model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[0]))
    shared = sharing_model.generate(source, attention_mask=mask, **decoding)
    hook.remove()
    repeated = in_repeated_layout(sharing_model).generate(source, attention_mask=mask, **decoding)
    assert rows == [3]
    assert torch.equal(shared.sequences, repeated.sequences)
    torch.testing.assert_close(shared.sequences_scores, repeated.sequences_scores)
    assert shared.cache.cross_attention_cache.layers[0].keys.shape[0] == 12
    assert_same_cache(shared.cache, repeated.cache)


@pytest.mark.parametrize("cache_argument", ["cache", "past_key_values"])
@pytest.mark.parametrize("num_beams", [1, 4])
def test_generation_continues_from_the_cache_it_returned(sharing_model, num_beams, cache_argument):
    """Greedy: 3 tokens, then 1 more from the returned cache, is 4 tokens in one go (tokens, scores, cache), as
    transformers' `test_generate_continue_from_past_key_values` checks. Beam search starts afresh in each call, so
    its continuation is compared with the same continuation in transformers' repeated layout instead. The cache goes
    back under transformers 5.24's name `cache` and under the old `past_key_values`, with its warning."""
    source, mask = padded_sources()
    prompt = random_ids(3, 5, seed=4)  # a decoder prompt with its mask, as transformers' check gives them
    prompt[:, 0] = BOS
    decoding = {"num_beams": num_beams, "return_dict_in_generate": True, "output_logits": True, "eos_token_id": -1}

    def continued(model):
        first = model.generate(source, attention_mask=mask, decoder_input_ids=prompt, max_new_tokens=3,
                               decoder_attention_mask=torch.ones_like(prompt), **decoding)
        old_name = pytest.warns(FutureWarning, match="`past_key_values` is deprecated")
        with old_name if cache_argument == "past_key_values" else contextlib.nullcontext():
            then = model.generate(source, attention_mask=mask, decoder_input_ids=first.sequences,
                                  decoder_attention_mask=torch.ones_like(first.sequences),
                                  max_new_tokens=1, **{cache_argument: first.cache}, **decoding)
        return first, then

    first, then = continued(sharing_model)
    if num_beams == 1:
        at_once = sharing_model.generate(source, attention_mask=mask, decoder_input_ids=prompt, max_new_tokens=4,
                                         decoder_attention_mask=torch.ones_like(prompt), **decoding)
        torch.testing.assert_close(torch.stack(first.logits + then.logits), torch.stack(at_once.logits))
    else:
        at_once = continued(in_repeated_layout(sharing_model))[1]
    assert torch.equal(then.sequences, at_once.sequences)
    assert_same_cache(then.cache, at_once.cache)


def test_a_plain_model_continues_from_its_cache_with_its_default_decoding(trained_model):
    """transformers' `test_generate_continue_from_past_key_values` as it runs: no decoding arguments (the model's
    defaults: greedy), 3 tokens and then 1 more from the returned cache give the tokens and logits of 4 at once. The
    decoder's mask goes with the tokens: how transformers tells an encoder-decoder's cached tokens from new ones."""
    source, mask = padded_sources()
    dictionary = {"return_dict_in_generate": True, "output_logits": True, "eos_token_id": -1}
    at_once = trained_model.generate(source, attention_mask=mask, max_new_tokens=4, **dictionary)
    first = trained_model.generate(source, attention_mask=mask, max_new_tokens=3, **dictionary)
    then = trained_model.generate(source, attention_mask=mask, decoder_input_ids=first.sequences, cache=first.cache,
                                  decoder_attention_mask=torch.ones_like(first.sequences), max_new_tokens=1,
                                  **dictionary)
    assert torch.equal(then.sequences, at_once.sequences)
    torch.testing.assert_close(torch.stack(first.logits + then.logits), torch.stack(at_once.logits))


def test_a_cache_passed_under_its_old_name_past_key_values_is_used(trained_model):
    """transformers 5.24 renamed the cache argument to `cache`; a caller still passing `past_key_values=` decodes as
    before: the second token from the first's cache has the logits of both tokens decoded at once without one."""
    source, mask = padded_sources()
    tokens = random_ids(3, 2, seed=5)
    tokens[:, 0] = BOS
    at_once = trained_model(source, attention_mask=mask, decoder_input_ids=tokens, use_cache=False).logits
    first = trained_model(source, attention_mask=mask, decoder_input_ids=tokens[:, :1], use_cache=True)
    second = trained_model(source, attention_mask=mask, decoder_input_ids=tokens[:, 1:],
                           past_key_values=first.cache, use_cache=True)
    torch.testing.assert_close(second.logits[:, 0], at_once[:, 1])
    assert second.cache is first.cache and second.cache.get_seq_length() == 2


def test_a_compiled_forward_with_a_static_cache_decodes_as_the_dynamic_cache_and_never_recompiles(trained_model):
    """What transformers' `test_generate_compile_model_forward_fullgraph` and
    `test_static_cache_no_recompile_with_smaller_length` check, here: with a static cache, generate() compiles the
    decoding step whole (fullgraph: a graph break raises), its tokens are the dynamic cache's for two different
    input sets, and the second input set and then a shorter output reuse the compiled step. (A source of another
    length is another shape of the cross-attention cache: with `dynamic=False`, a new graph, as for any model.)"""
    from transformers import CompileConfig

    source, mask = padded_sources()
    other, other_mask = random_ids(3, 7, seed=21), torch.ones(3, 7, dtype=torch.long)
    # aot_eager: the graph dynamo captures and AOTAutograd traces, run by torch's kernels. inductor's C++ code for a
    # CPU is no decoding path: transformers compiles on accelerators only, unless told (below); inductor compiles the
    # model on a GPU in benchmarks/gpu_check.py.
    compile_config = CompileConfig(fullgraph=True, dynamic=False, backend="aot_eager", mode="default")
    compile_config._compile_all_devices = True
    model = tiny_model(seed=1).eval()
    model.load_state_dict(trained_model.state_dict())
    static = {"cache_implementation": "static", "compile_config": compile_config}
    first = model.generate(source, attention_mask=mask, **GREEDY, **static)
    assert "_compiled_call" in vars(model)  # transformers compiled the forward
    assert torch.equal(first, trained_model.generate(source, attention_mask=mask, **GREEDY))
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = model.generate(other, attention_mask=other_mask, **GREEDY, **static)
        shorter = model.generate(source, attention_mask=mask, num_beams=1, max_new_tokens=6, **static)
    assert torch.equal(again, trained_model.generate(other, attention_mask=other_mask, **GREEDY))
    assert torch.equal(shorter, trained_model.generate(source, attention_mask=mask, num_beams=1, max_new_tokens=6))


def test_other_attention_kernels_share_no_source_and_the_model_wants_one_encoder_row_per_decoder_row():
    """Kernels whose masks may not broadcast over a block of beams' queries (flash attention's varlen path; here a
    registered kernel) compute the cross-attention keys and values of every beam in generate() of a transformed
    model; the model file itself takes one encoder row per decoder row, else a one-line error."""
    AttentionInterface.register("vaswani_test_kernel", sdpa_attention_forward)
    model = fast_cpu(tiny_model(seed=2), {**PLAIN, "beam": {"shared": True, "packed": False}})
    model.set_attn_implementation("vaswani_test_kernel")
    source = random_ids(3, 7, seed=11)
    rows = []
    hook = model.model.decoder.layers[0].encoder_attn.k_proj.register_forward_hook(
        lambda module, args, output: rows.append(args[0].shape[0]))
    model.generate(source, **BEAM_4)
    hook.remove()
    assert rows == [12]
    encoder_outputs = model.get_encoder()(input_ids=source)
    with pytest.raises(ValueError, match="the decoder has 12 rows but the encoder output 3: give one encoder row per"):
        model(encoder_outputs=encoder_outputs, decoder_input_ids=random_ids(12, 2))


def test_with_synced_gpus_every_process_steps_the_model_until_all_are_done(tmp_path):
    """generate(synced_gpus=True), as Seq2SeqTrainer asks under FSDP, where each forward gathers weights from every
    process: two processes (gloo) whose sources end at different steps both call the decoder as often as the longer
    search needs, and each gets the tokens of the search alone; so does a model that transformers knows sharded
    (its FSDP's mark) without being asked, as transformers' generate syncs by default."""
    script = tmp_path / "decode.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        import torch
        sys.path.insert(0, sys.argv[1])
        from support import random_ids, tiny_model
        from vaswani_hf.gnmt import gnmt_beam_search, gnmt_length_penalty

        torch.distributed.init_process_group("gloo")
        rank = torch.distributed.get_rank()
        model = tiny_model()
        model.generation_config.num_beams, model.generation_config.gnmt_alpha = 3, 0.6
        source = random_ids(2, 3 + 9 * rank, seed=rank)  # limits of 3 + 50 and 12 + 50 tokens
        calls = []
        model.get_decoder().register_forward_hook(lambda *args: calls.append(1))
        alone = gnmt_beam_search(model, source, None, 3, 0.6)
        steps_alone, calls[:] = len(calls), []
        synced = model.generate(source, synced_gpus=True)
        steps_synced, calls[:] = len(calls), []
        model._is_fsdp_managed_module = True  # what transformers' FSDP sets on the models it shards
        sharded = model.generate(source)
        print(json.dumps({"alone": steps_alone, "synced": steps_synced, "same": torch.equal(synced, alone),
                          "sharded": len(calls), "same_sharded": torch.equal(sharded, alone)}))
        torch.distributed.destroy_process_group()
        """), encoding="utf-8")
    result = run_forked([Path(__file__).parent], torch_ranks(), timeout=300, script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    found = [json.loads(line) for line in result.stdout.splitlines()]
    alone = [rank["alone"] for rank in found]
    assert alone[0] != alone[1]  # the processes' searches end at different steps
    assert [rank["synced"] for rank in found] == [rank["sharded"] for rank in found] == [max(alone)] * 2
    assert all(rank["same"] and rank["same_sharded"] for rank in found)
