"""The paper's decoding (§6.1): beam search with the GNMT length penalty, checked against brute force."""

import contextlib
import copy
import functools
import itertools
import re

import pytest
import torch
from support import BOS, EOS, PAD, random_ids, tiny_config, tiny_model
from tokenizers import Tokenizer, decoders
from tokenizers.models import WordLevel
from transformers import (
    ExponentialDecayLengthPenalty,
    ForcedEOSTokenLogitsProcessor,
    LogitsProcessor,
    LogitsProcessorList,
    NoBadWordsLogitsProcessor,
    NoRepeatNGramLogitsProcessor,
    PrefixConstrainedLogitsProcessor,
    PreTrainedTokenizerFast,
    RepetitionPenaltyLogitsProcessor,
    StoppingCriteria,
    StoppingCriteriaList,
    SuppressTokensLogitsProcessor,
    SynthIDTextWatermarkingConfig,
    WatermarkDetector,
    WatermarkingConfig,
    WatermarkLogitsProcessor,
)
from transformers.cache_utils import DynamicLayer
from transformers.modeling_outputs import BaseModelOutput, Seq2SeqLMOutput

from vaswani_hf import fast_cpu, gnmt
from vaswani_hf.gnmt import BeamLayer, gnmt_beam_search, gnmt_length_penalty
from vaswani_hf.speed.decoding import PLAIN


def test_length_penalty_is_gnmts():
    assert gnmt_length_penalty(1, 0.6) == 1.0
    assert gnmt_length_penalty(7, 0.6) == pytest.approx(2 ** 0.6)
    assert gnmt_length_penalty(10, 0.0) == 1.0


@torch.no_grad()
def sequence_log_probs(model, source, hypotheses: list[list[int]], begun: tuple = ()) -> list[float]:
    """log P(hypothesis | source) of hypotheses of one length, each teacher-forced (one forward pass for them all);
    with `begun`, log P(hypothesis | source, the output begun with those tokens)."""
    targets = torch.tensor(hypotheses)
    given = torch.tensor([[BOS, *begun]]).expand(len(hypotheses), -1)
    logits = model(input_ids=source.expand(len(hypotheses), -1),
                   decoder_input_ids=torch.cat([given, targets[:, :-1]], dim=1)).logits[:, len(begun):]
    return logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1).sum(-1).tolist()


def ends(hypothesis: list[int], stop: tuple = ()) -> bool:
    """Whether a hypothesis ended as asked: by EOS, or, with `stop`, by a stopping criterion that ends one whose last
    tokens are those."""
    return hypothesis[-1] == EOS or bool(stop) and tuple(hypothesis[-len(stop):]) == stop


def brute_force(model, source, vocab, max_length, alpha, min_new_tokens, begun: tuple = (), stop: tuple = ()):
    """Score every hypothesis: ended by EOS within max_length tokens (after at least min_new_tokens others), or cut
    at max_length. All of them, best first, the cut ones after all that ended (tensor2tensor returns a cut one only
    where none ended): [(hypothesis, penalized score)]. With `begun`, every continuation of those tokens, scored,
    counted and limited without them. With `stop`, a hypothesis also ends, as by EOS, once its last tokens are them."""
    scored = []
    for length in range(1, max_length + 1):
        candidates = [hypothesis for hypothesis in map(list, itertools.product(range(vocab), repeat=length))
                      if EOS not in hypothesis[:min_new_tokens] and (length == max_length or ends(hypothesis, stop))
                      and not any(ends(hypothesis[:end], stop) for end in range(1, length))]
        log_probs = sequence_log_probs(model, source, candidates, begun) if candidates else []
        scored += [(hypothesis, log_prob / gnmt_length_penalty(length, alpha))
                   for hypothesis, log_prob in zip(candidates, log_probs, strict=True)]
    return sorted(scored, key=lambda pair: (not ends(pair[0], stop), -pair[1]))


def hypotheses(found: torch.Tensor, stop: tuple = ()) -> list[list[int]]:
    """Rows without the start token, cut where they ended: after EOS, or after `stop`'s tokens."""
    assert (found[:, 0] == BOS).all()
    rows = [row[1:].tolist() for row in found]
    return [next((row[:end] for end in range(1, len(row) + 1) if ends(row[:end], stop)), row) for row in rows]


@pytest.mark.parametrize("min_new_tokens", [0, 1])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_an_exhaustive_beam_returns_the_brute_force_best(alpha, min_new_tokens):
    vocab, max_length = 5, 3
    for seed in range(4):
        model = sharpened_model(seed, vocab)
        source = torch.randint(3, vocab, (1, 4), generator=torch.Generator().manual_seed(seed))
        expected = brute_force(model, source, vocab, max_length, alpha, min_new_tokens)[0][0]
        # a beam as wide as every prefix makes the search exhaustive
        found = gnmt_beam_search(model, source, num_beams=vocab ** max_length, alpha=alpha, max_new_tokens=max_length,
                                 min_new_tokens=min_new_tokens)
        assert hypotheses(found) == [expected], (seed, alpha)


@pytest.mark.parametrize("alpha", [0.0, 0.6, 2.0])
def test_given_a_beginning_an_exhaustive_beam_returns_the_brute_force_best_continuation(alpha):
    """`decoder_input_ids` (transformers' decoder prompt): the search returns the beginning and the best continuation
    of it by brute force, scored, counted and limited without the tokens given, with its score."""
    vocab, max_length, begun = 5, 3, (4, 3)
    for seed in range(3):
        model = sharpened_model(seed, vocab)
        source = torch.randint(3, vocab, (1, 4), generator=torch.Generator().manual_seed(seed))
        expected, score = brute_force(model, source, vocab, max_length, alpha, 1, begun)[0]
        found, scores = gnmt_beam_search(model, source, num_beams=vocab ** max_length, alpha=alpha,
                                         max_new_tokens=max_length, output_scores=True,
                                         decoder_input_ids=torch.tensor([[BOS, *begun]]))
        assert found[0, :3].tolist() == [BOS, *begun]
        assert hypotheses(torch.cat([found[:, :1], found[:, 3:]], 1)) == [expected], (seed, alpha)
        torch.testing.assert_close(scores, torch.tensor([score]), atol=1e-5, rtol=0)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize(("max_length", "min_new_tokens"), [(3, 1), (1, 0)])  # (1, 0): one ends, three are cut
def test_the_n_best_are_the_brute_force_n_best_with_their_scores(alpha, max_length, min_new_tokens):
    vocab, n = 5, 4
    for seed in range(3):
        model = sharpened_model(seed, vocab)
        source = torch.randint(3, vocab, (2, 4), generator=torch.Generator().manual_seed(seed))
        found, scores = gnmt_beam_search(model, source, num_beams=vocab ** max_length, alpha=alpha,
                                         max_new_tokens=max_length, min_new_tokens=min_new_tokens,
                                         num_return_sequences=n, output_scores=True)
        assert found.shape[0] == scores.shape[0] == 2 * n
        for row in range(2):
            expected = brute_force(model, source[row : row + 1], vocab, max_length, alpha, min_new_tokens)[:n]
            assert hypotheses(found[row * n : (row + 1) * n]) == [hypothesis for hypothesis, _ in expected]
            torch.testing.assert_close(scores[row * n : (row + 1) * n], torch.tensor([s for _, s in expected]),
                                       atol=1e-5, rtol=0)


class EndsWith(StoppingCriteria):
    """A stopping criterion, as transformers' `StopStringCriteria` is one: it stops the rows whose last tokens are
    `tail`."""

    def __init__(self, tail: tuple):
        self.tail = torch.tensor(tail)

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        return (input_ids[:, -len(self.tail):] == self.tail).all(-1)


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize(("stop", "max_length"), [((4,), 3), ((3, 4), 3), ((4,), 1)])  # 1: one stops, two are cut
def test_a_stopping_criterion_ends_hypotheses_as_eos_does_and_the_n_best_are_the_brute_force_n_best(
        stop, max_length, alpha):
    """transformers' stopping criteria (stop strings, a criterion of the caller's), asked of every candidate as its
    beam search asks them: a hypothesis they stop has ended, as one ended by EOS, and competes for the finished slots
    with its score. An exhaustive beam returns the brute-force n best of each source of a batch, with their scores."""
    vocab, n, changed = 5, 3, 0
    criteria = StoppingCriteriaList([EndsWith(stop)])
    for seed in range(3):
        model = sharpened_model(seed, vocab)
        source = torch.randint(3, vocab, (2, 4), generator=torch.Generator().manual_seed(seed))
        search = functools.partial(gnmt_beam_search, model, source, num_beams=vocab ** max_length, alpha=alpha,
                                   max_new_tokens=max_length, num_return_sequences=n, output_scores=True)
        found, scores = search(stopping_criteria=criteria)
        for row in range(2):
            expected = brute_force(model, source[row : row + 1], vocab, max_length, alpha, 1, stop=stop)[:n]
            assert hypotheses(found[row * n : (row + 1) * n], stop) == [hypothesis for hypothesis, _ in expected]
            torch.testing.assert_close(scores[row * n : (row + 1) * n], torch.tensor([s for _, s in expected]),
                                       atol=1e-5, rtol=0)
        changed += not torch.equal(found, search()[0])
    assert changed  # the criterion made a difference here


@torch.no_grad()
def processed_log_prob(model, source, hypothesis: list[int], banned) -> float:
    """log P(hypothesis | source) where each step's distribution is cut to the tokens `banned(prefix)` (the prefix from
    the start token on) does not name and normalized again: -inf if the hypothesis takes a banned token."""
    decoder_input = torch.tensor([[BOS, *hypothesis[:-1]]])
    log_probs = model(input_ids=source, decoder_input_ids=decoder_input).logits[0].log_softmax(-1)
    total = 0.0
    for step, token in enumerate(hypothesis):
        allowed = [t for t in range(log_probs.shape[-1]) if t not in banned([BOS, *hypothesis[:step]])]
        if token not in allowed:
            return float("-inf")
        total += float(log_probs[step, token] - log_probs[step, allowed].logsumexp(-1))
    return total


def repeats_a_bigram(prefix: list[int]) -> set[int]:
    """The tokens after which the prefix's last two tokens would be a bigram it already holds."""
    return {second for first, second in itertools.pairwise(prefix) if first == prefix[-1]}


@pytest.mark.parametrize("alpha", [0.0, 0.6])
@pytest.mark.parametrize(("processor", "banned"), [
    (NoRepeatNGramLogitsProcessor(2), repeats_a_bigram),
    (NoBadWordsLogitsProcessor([[1], [4, 3]], eos_token_id=EOS),
     lambda prefix: {1} | ({3} if prefix[-1] == 4 else set())),
], ids=["no repeated bigram", "banned words"])
def test_with_a_logits_processor_an_exhaustive_beam_returns_the_brute_force_best_of_what_it_allows(
        processor, banned, alpha):
    """transformers' logits processors cut each step's distribution, which the search normalizes again (as
    transformers' `renormalize_logits`): the winner is the best hypothesis by that distribution, found by brute force
    over every hypothesis, those that take a banned token excluded."""
    vocab, max_length, changed = 5, 3, 0
    for seed in range(3):
        model = sharpened_model(seed, vocab)
        source = torch.randint(3, vocab, (1, 4), generator=torch.Generator().manual_seed(seed))
        candidates = [[*prefix, last] for length in range(2, max_length + 1)
                      for prefix in itertools.product([t for t in range(vocab) if t != EOS], repeat=length - 1)
                      for last in ([EOS] if length < max_length else range(vocab))]
        scored = [(hypothesis[-1] == EOS, processed_log_prob(model, source, hypothesis, banned)
                   / gnmt_length_penalty(len(hypothesis), alpha), hypothesis) for hypothesis in candidates]
        expected = max(scored)[2]
        found = gnmt_beam_search(model, source, num_beams=vocab ** max_length, alpha=alpha, max_new_tokens=max_length,
                                 logits_processor=LogitsProcessorList([processor]))
        assert hypotheses(found) == [expected], (seed, alpha)
        unprocessed = gnmt_beam_search(model, source, num_beams=vocab ** max_length, alpha=alpha,
                                       max_new_tokens=max_length)
        changed += hypotheses(unprocessed) != [expected]
    assert changed  # the processor made a difference here


@torch.no_grad()
def textbook_beam_search(model, source, num_beams, alpha, max_length, min_new_tokens, n=1, stop: tuple = ()):
    """tensor2tensor's search for one source, written plainly: each alive hypothesis teacher-forced anew (no cache),
    the 2K best candidates of a step taken, those ending (EOS, or the length limit) scored log P / lp(|Y|), the K
    best others kept alive. The n best that ended by EOS win, then the best cut ones. It runs to the limit: log P
    only falls and lp only grows up to lp(limit), so stopping early, as the search does, cannot change the winners.
    With `stop`, a candidate whose last tokens are those ends too, as by EOS."""
    alive, ended = [([], 0.0)], []  # (hypothesis, log P); (by EOS, penalized score, hypothesis)
    for step in range(1, max_length + 1):
        hypotheses = torch.tensor([[BOS, *hypothesis] for hypothesis, _ in alive])
        logits = model(input_ids=source.expand(len(alive), -1), decoder_input_ids=hypotheses).logits[:, -1]
        log_probs = logits.float().log_softmax(-1)
        if step <= min_new_tokens:
            log_probs[:, EOS] = float("-inf")
        candidates = sorted(((hypothesis + [token], log_p + float(log_probs[row, token]))
                             for row, (hypothesis, log_p) in enumerate(alive) for token in range(logits.shape[-1])),
                            key=lambda candidate: -candidate[1])[: 2 * num_beams]
        ending = [ends(candidate[0], stop) or step == max_length for candidate in candidates]
        ended += [(ends(hypothesis, stop), log_p / gnmt_length_penalty(step, alpha), hypothesis)
                  for (hypothesis, log_p), end in zip(candidates, ending, strict=True) if end]
        alive = [candidate for candidate, end in zip(candidates, ending, strict=True) if not end][:num_beams]
    return [hypothesis for *_, hypothesis in sorted(ended, reverse=True)[:n]]


@pytest.mark.parametrize("stop", [(), (5, 3)], ids=["EOS", "a stopping criterion"])
@pytest.mark.parametrize("alpha", [0.6, 2.0])  # 2.0: lengths reward enough to punish an early stop
@pytest.mark.parametrize("num_beams", [2, 3])
def test_a_narrow_beam_keeps_what_tensor2tensors_keeps(num_beams, alpha, stop):
    """With K < the vocabulary the search is no longer exhaustive: it must keep exactly tensor2tensor's hypotheses
    (2K candidates a step, an ended one never taking an alive one's place) to return the textbook search's winner, for
    each source of a batch, with a cache; a stopping criterion ends hypotheses as EOS does."""
    vocab, max_length = 8, 6
    criteria = StoppingCriteriaList([EndsWith(stop)]) if stop else None
    for seed in range(4):
        model = sharpened_model(seed, vocab)
        sources = torch.randint(3, vocab, (4, 5), generator=torch.Generator().manual_seed(seed))
        found = gnmt_beam_search(model, sources, num_beams=num_beams, alpha=alpha, max_new_tokens=max_length,
                                 stopping_criteria=criteria)
        expected = [textbook_beam_search(model, source[None], num_beams, alpha, max_length, 1, stop=stop)[0]
                    for source in sources]
        assert hypotheses(found, stop) == expected, (seed, alpha)


class ChainModel(torch.nn.Module):
    """A model whose next token depends on the last one alone, the source ignored: after the start token, EOS with
    probability `eos_first` or the chain A B C EOS, each of its tokens nearly certain once it began (the rest on
    other tokens), so a search meets exactly the hypotheses one can write down. `steps` counts its decoding steps."""

    A, B, C = 3, 4, 5

    def __init__(self, eos_first: float):
        super().__init__()
        self.config = tiny_config(vocab_size=6)
        probabilities = torch.full((6, 6), 1e-4)
        probabilities[BOS, [PAD, BOS]] = 0.0
        probabilities[BOS, [EOS, self.A, self.B, self.C]] = torch.tensor([eos_first, 0.95 - eos_first, 0.025, 0.025])
        probabilities[[self.A, self.B, self.C], [self.B, self.C, EOS]] = 1.0
        self.log_probs, self.steps = (probabilities / probabilities.sum(-1, keepdim=True)).log(), 0

    def get_encoder(self):
        return lambda input_ids, attention_mask: BaseModelOutput(last_hidden_state=torch.zeros(*input_ids.shape, 1))

    def forward(self, decoder_input_ids, **inputs):
        self.steps += 1
        return Seq2SeqLMOutput(logits=self.log_probs[decoder_input_ids])


CHAIN = [ChainModel.A, ChainModel.B, ChainModel.C, EOS]


# A B C EOS wins, which only the bound lp(limit) keeps looking for (its log P over lp(1) is below EOS's); EOS wins and
# A B C EOS is second, sought only while the second slot can improve; EOS alone.
@pytest.mark.parametrize(("eos_first", "winners", "steps"), [(0.5, [CHAIN], 4), (0.7, [[EOS], CHAIN], 4),
                                                             (0.7, [[EOS]], 1)])
def test_the_search_stops_once_no_alive_hypothesis_can_win_and_not_before(eos_first, winners, steps):
    """§6.1: "terminate early when possible". A source's search stops once its n-th best finished hypothesis scores
    at least what the best alive one still can: its log P (which only falls) over lp(limit) (lp only grows), not over
    lp of the step it is at; and not later: the chain's outcome is settled after `steps` steps of its limit's 6."""
    model, source, n = ChainModel(eos_first), torch.tensor([[3, 4]]), len(winners)
    assert textbook_beam_search(model, source, num_beams=2, alpha=0.6, max_length=6, min_new_tokens=0, n=n) == winners
    model.steps = 0
    found = gnmt_beam_search(model, source, num_beams=2, alpha=0.6, max_new_tokens=6, min_new_tokens=0,
                             num_return_sequences=n)
    assert hypotheses(found) == winners and model.steps == steps


def test_the_best_of_the_n_best_is_the_single_best(trained_model):
    source = random_ids(3, 7, seed=5)
    best = gnmt_beam_search(trained_model, source)
    n_best = gnmt_beam_search(trained_model, source, num_return_sequences=4)
    assert torch.equal(n_best[::4, : best.shape[1]], best) and (n_best[::4, best.shape[1] :] == PAD).all()
    with pytest.raises(ValueError, match="num_return_sequences must be between 1 and num_beams=4, got 5"):
        gnmt_beam_search(trained_model, source, num_return_sequences=5)


def sharpened_model(seed: int, vocab: int):
    model = tiny_model(seed=seed, vocab_size=vocab)
    with torch.no_grad():  # sharpen the random model so that lengths and penalties matter
        model.lm_head.weight.mul_(4)
    return model


@pytest.mark.parametrize(("seed", "vocab"), [(1, 20), (2, 8), (5, 20)])
def test_one_beam_is_greedy_decoding(seed, vocab):
    """tensor2tensor decodes greedily when the beam size is 1, and so does the search: transformers' greedy
    `generate()` (EOS forbidden at the first step, as the search forbids it) token for token. On these random
    models a beam of one that also kept the best candidate ending by EOS aside finished some sentences otherwise."""
    model = tiny_model(seed=seed, vocab_size=vocab)
    with torch.no_grad():  # sharpened, so that EOS is often a close second
        model.lm_head.weight.mul_(3)
    source = random_ids(8, 6, vocab=vocab, seed=seed)
    found = gnmt_beam_search(model, source, num_beams=1, alpha=0.6, max_new_tokens=12)
    greedy = model.generate(input_ids=source, num_beams=1, max_new_tokens=12, min_new_tokens=1)
    assert torch.equal(found[:, : greedy.shape[1]], greedy) and (found[:, greedy.shape[1] :] == PAD).all()


def test_generate_decodes_one_beam_of_the_papers_decoding_as_the_search_does():
    """A generation config of the paper's decoding with one beam (a run's with --num_beams 1): `generate()` hands it
    to transformers' greedy search, which must not end an output before its first token either, or a briefly trained
    model's generate() gives empty outputs where vaswani-translate and the run's evaluation (the search) do not."""
    model = tiny_model(seed=2, add_final_logits_bias=True)
    model.final_logits_bias[0, EOS] = 3.0  # EOS likely from the first step on
    model.generation_config.gnmt_alpha, model.generation_config.num_beams = 0.6, 1
    source = random_ids(8, 6, seed=2)
    with torch.no_grad():
        first = model(input_ids=source, decoder_input_ids=torch.full((8, 1), BOS)).logits[:, -1].argmax(-1)
    assert (first == EOS).any() and (first != EOS).any()  # some outputs would end at once, others not
    found = gnmt_beam_search(model, source, num_beams=1, alpha=0.6)
    greedy = model.generate(input_ids=source)
    assert torch.equal(found[:, : greedy.shape[1]], greedy) and (found[:, greedy.shape[1] :] == PAD).all()


def test_beam_4_is_batched_consistently_and_respects_the_length_limit(trained_model):
    source = random_ids(3, 7, seed=11)
    mask = torch.ones_like(source)
    mask[1, 4:] = 0
    source[1, 4:] = PAD
    batched = gnmt_beam_search(trained_model, source, attention_mask=mask)
    for row in range(3):
        alone = gnmt_beam_search(trained_model, source[row : row + 1, : int(mask[row].sum())])
        width = alone.shape[1]
        assert torch.equal(batched[row, :width], alone[0]) and (batched[row, width:] == PAD).all()
    never_ends = tiny_model(seed=1, add_final_logits_bias=True)
    never_ends.final_logits_bias[0, EOS] = -1e9  # EOS is never chosen
    out = gnmt_beam_search(never_ends, source, attention_mask=mask)
    assert out.shape[1] == 1 + 7 + 50
    assert (out[1, 1 + 4 + 50 :] == PAD).all() and (out[1, 1 : 1 + 4 + 50] != PAD).any()


@pytest.mark.parametrize("shared", [False, True])
def test_a_source_whose_search_is_done_leaves_the_batch(shared):
    """As fairseq's search drops a finalized sentence from its batch: once a source's search is done, the later steps
    decode only the other sources' beams, and each source's output is still the one it has decoded alone, bit for
    bit; also where its beams share the source's cross-attention keys and values (fast_cpu's plan)."""
    model = tiny_model(seed=1, add_final_logits_bias=True)
    model.final_logits_bias[0, EOS] = -1e9  # no output ends before its limit: its source's length + 1
    if shared:
        model = fast_cpu(model, {**PLAIN, "beam": {"shared": True, "lean": True, "packed": False}})
    source, mask = random_ids(3, 7, seed=11), torch.ones(3, 7, dtype=torch.long)
    mask[1, 2:], mask[2, 5:] = 0, 0
    source = source.masked_fill(mask == 0, PAD)
    rows = []
    model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    with model.fast_decoding(4) if shared else contextlib.nullcontext():
        batched = gnmt_beam_search(model, source, attention_mask=mask, extra_length=1)
        assert rows == [12] * 3 + [8] * 3 + [4] * 2  # 3 sources x 4 beams to the limit 3, then 2 to 6, then 1 to 8
        for row in range(3):
            alone = gnmt_beam_search(model, source[row : row + 1, : int(mask[row].sum())], extra_length=1)[0]
            assert torch.equal(batched[row, : len(alone)], alone) and (batched[row, len(alone) :] == PAD).all()


def test_with_logits_processors_no_source_leaves_the_batch_and_each_gets_what_it_gets_alone():
    """Processors may read the batch's layout (a prefix function is told each row's source; the encoder n-gram
    processors hold each source's ids): with them every source stays in the batch to the end, and each output is what
    its source decodes alone. Here each source is denied the first token it chose unconstrained."""
    model = tiny_model(seed=1, add_final_logits_bias=True)
    model.final_logits_bias[0, EOS] = -1e9  # no output ends before its limit: its source's length + 1
    source, mask = random_ids(3, 7, seed=11), torch.ones(3, 7, dtype=torch.long)
    mask[1, 2:], mask[2, 5:] = 0, 0
    source = source.masked_fill(mask == 0, PAD)
    search = functools.partial(gnmt_beam_search, model, extra_length=1, alpha=3.0)  # α 3: the longer, the better
    denied = search(source, attention_mask=mask)[:, 1].tolist()

    def denying(*sources):  # the prefix function of a batch of these sources
        allowed = [[t for t in range(model.config.vocab_size) if t != denied[s]] for s in sources]
        return LogitsProcessorList([PrefixConstrainedLogitsProcessor(lambda row, ids: allowed[row], num_beams=4)])

    rows = []
    model.get_decoder().register_forward_pre_hook(
        lambda module, args, kwargs: rows.append(kwargs["input_ids"].shape[0]), with_kwargs=True)
    batched = search(source, attention_mask=mask, logits_processor=denying(0, 1, 2))
    assert rows == [12] * 8
    for row in range(3):
        alone = search(source[row : row + 1, : int(mask[row].sum())], logits_processor=denying(row))[0]
        assert torch.equal(batched[row, : len(alone)], alone) and (batched[row, len(alone) :] == PAD).all()
        assert denied[row] not in alone.tolist()[1:]


def test_processors_that_ban_every_token_of_a_row_end_that_beam_and_of_every_beam_are_one_line():
    """A row whose every token the processors ban is a beam that ends nowhere: -inf, not NaN (which the search's top-k
    would rank first); a source left no hypothesis at all is a one-line error, not a row of padding."""
    class BanRows(LogitsProcessor):
        def __init__(self, rows):
            self.rows = torch.tensor(rows)

        def __call__(self, input_ids, scores):
            return scores.index_fill(0, self.rows, float("-inf"))

    log_probs = torch.randn(3, 7).log_softmax(-1)
    out = gnmt.processed(LogitsProcessorList([BanRows([1])]), torch.zeros(3, 1, dtype=torch.long), log_probs)
    assert (out[1] == float("-inf")).all() and torch.allclose(out[[0, 2]], log_probs[[0, 2]])
    model, source = tiny_model(), random_ids(3, 5)
    with pytest.raises(ValueError, match=r"^the logits processors leave source 1 of the batch no hypothesis: they ban "
                                         r"every continuation of its beams$"):  # the second source's 3 rows
        gnmt_beam_search(model, source, num_beams=3, logits_processor=LogitsProcessorList([BanRows([3, 4, 5])]))


def test_the_searchs_cache_layer_holds_what_transformers_layer_holds_copied_once_a_step():
    """Reordered and grown step after step (beams of 6 rows, then of the 4 that stay), `BeamLayer` holds exactly what
    transformers' `DynamicLayer` holds, read between a reordering and the update too; each update writes into the
    tensor the reordering made, not a new one. After a change it did not make (rows selected, keys and values given as
    the ONNX engine gives them, a step of two positions), it grows as transformers' layer does; given a step of
    other rows, it fails as that does."""
    generator = torch.Generator().manual_seed(0)

    def states(rows, length):  # (B, h, t, d_k) keys and (B, h, t, d_v) values
        return tuple(torch.randn(rows, 2, length, width, generator=generator) for width in (3, 5))

    ours, transformers = BeamLayer(), DynamicLayer()

    def same():
        assert torch.equal(ours.keys, transformers.keys) and torch.equal(ours.values, transformers.values)

    first = states(6, 3)
    ours.update(*first), transformers.update(*first)
    orders = [[1, 1, 0, 5, 2, 2], [0, 1, 2, 3, 4, 5], [3, 0, 0, 1], [2, 2, 2, 2]]
    for order in orders:
        order = torch.tensor(order)
        ours.reorder_cache(order), transformers.reorder_cache(order)
        same()
        reordered = ours.keys.data_ptr(), ours.values.data_ptr()
        new = states(len(order), 1)
        assert all(torch.equal(a, b) for a, b in zip(ours.update(*new), transformers.update(*new), strict=True))
        same()
        assert (ours.keys.data_ptr(), ours.values.data_ptr()) == reordered  # grown in place: one copy a step
    def assign(layer):  # as the ONNX engine gives the layer the keys and values its graph grew
        layer.keys, layer.values = layer.keys * 2, layer.values * 2

    for order, change, positions in (([3, 1, 0, 2], lambda layer: layer.batch_select_indices(torch.tensor([0, 2])), 1),
                                     ([1, 0], assign, 1), ([0, 1], lambda layer: None, 2)):
        ours.reorder_cache(torch.tensor(order)), transformers.reorder_cache(torch.tensor(order))
        change(ours), change(transformers)
        new = states(2, positions)
        ours.update(*new), transformers.update(*new)
        same()
    ours.reorder_cache(torch.tensor([0, 1])), transformers.reorder_cache(torch.tensor([0, 1]))
    for layer in (ours, transformers):  # a step of one row for a cache of two: an error, not one row copied to both
        with pytest.raises(RuntimeError):
            layer.update(*states(1, 1))


def test_the_search_decodes_with_its_cache_layer_what_it_decodes_with_transformers(trained_model, monkeypatch):
    """`BeamLayer` changes no output: the search with transformers' `DynamicLayer` in its place gives the same n best
    and scores, bit for bit, sources leaving the batch as they end; one beam too."""
    source, mask = random_ids(4, 7, seed=3), torch.ones(4, 7, dtype=torch.long)
    mask[1, 3:], mask[3, 5:] = 0, 0
    source = source.masked_fill(mask == 0, PAD)
    runs, made = [], []

    class Recorded(BeamLayer):
        def __init__(self):
            super().__init__()
            made.append(self)

    for layer in (Recorded, DynamicLayer):
        monkeypatch.setattr(gnmt, "BeamLayer", layer)
        runs.append([gnmt_beam_search(trained_model, source, mask, beams, num_return_sequences=n, output_scores=True)
                     for beams, n in ((4, 2), (1, 1))])
    assert len(made) == 2 * trained_model.config.num_decoder_layers  # the search's self-attention layers, each run
    for (ours, our_scores), (theirs, their_scores) in zip(*runs, strict=True):
        assert torch.equal(ours, theirs) and torch.equal(our_scores, their_scores)


def test_a_saved_model_decodes_the_papers_way_however_it_is_loaded(tmp_path):
    """A generation config with `gnmt_alpha` (as training/run.py saves it): `generate()` of the loaded model is the
    GNMT beam search; other decodings go to transformers. (The folder's own code, loaded with trust_remote_code
    where the package is not installed: tests/test_ecosystem.py.)"""
    from transformers import AutoModelForSeq2SeqLM

    saved = tiny_model(seed=3)
    saved.generation_config.num_beams, saved.generation_config.gnmt_alpha = 4, 0.6
    saved.generation_config._from_model_config = False  # else loading drops gnmt_alpha (training/hub.py does this too)
    saved.save_pretrained(tmp_path)
    source = random_ids(3, 7, seed=12)
    mask = torch.ones_like(source)
    expected = gnmt_beam_search(saved, source, attention_mask=mask, num_beams=4, alpha=0.6)
    greedy = tiny_model(seed=3).generate(source, attention_mask=mask, max_new_tokens=9)
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path).eval()
    assert torch.equal(model.generate(input_ids=source, attention_mask=mask), expected)
    assert torch.equal(model.generate(source, attention_mask=mask), expected)
    assert torch.equal(model.generate(input_ids=source, attention_mask=mask, num_beams=1, max_new_tokens=9), greedy)
    # from_pretrained's keyword arguments reach the generation config too: the model config's are not decoding's.
    tuned = type(model).from_pretrained(tmp_path, dropout=0.2).eval()
    assert tuned.config.dropout == tuned.generation_config.dropout == 0.2
    assert torch.equal(tuned.generate(source, attention_mask=mask), expected)

    # Transformed by fast_cpu with a plan that packs, the folder's search runs inside a packing block.
    from vaswani_hf import fast_cpu
    from vaswani_hf.speed.kernels import PACKING

    in_decoding_block = []
    packing = {"greedy": {"packed": True}, "beam": {"shared": True, "packed": True}, "training": {"onednn": False}}
    fast_cpu(model, packing).lm_head.register_forward_hook(
        lambda module, args, output: in_decoding_block.append(PACKING.open > 0))
    assert torch.equal(model.generate(input_ids=source, attention_mask=mask), expected)
    assert in_decoding_block and all(in_decoding_block)


def test_no_empty_translation_unless_asked(trained_model):
    """A model that prefers EOS everywhere: with min_new_tokens=1 (the default) a token comes first."""
    source = random_ids(2, 6, seed=9)
    handle = trained_model.lm_head.register_forward_hook(lambda module, args, out: out.index_add(
        -1, torch.tensor([EOS]), torch.full((*out.shape[:-1], 1), 30.0)))
    try:
        empty = gnmt_beam_search(trained_model, source, min_new_tokens=0)
        not_empty = gnmt_beam_search(trained_model, source)
    finally:
        handle.remove()
    assert empty[:, :2].tolist() == [[BOS, EOS]] * 2
    assert (not_empty[:, 1] != EOS).all() and (not_empty[:, 2] == EOS).all()


@pytest.mark.parametrize("kernel", ["eager", "sdpa", "vaswani_repeated_rows"])
def test_the_search_decodes_with_every_attention_kernel(trained_model, kernel):
    """The model declares eager, SDPA and flash attention (which needs a GPU; a registered kernel, SDPA under another
    name, stands in for any other). Each decodes the search's tokens and scores."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register("vaswani_repeated_rows", sdpa_attention_forward)
    AttentionMaskInterface.register("vaswani_repeated_rows", sdpa_mask)
    source = random_ids(3, 7, seed=4)
    expected, expected_scores = gnmt_beam_search(trained_model, source, num_beams=4, output_scores=True)
    model = copy.deepcopy(trained_model)
    model.set_attn_implementation(kernel)
    found, scores = gnmt_beam_search(model, source, num_beams=4, output_scores=True)
    assert torch.equal(found, expected)
    torch.testing.assert_close(scores, expected_scores, rtol=1e-5, atol=1e-5)


def test_a_generation_config_given_to_generate_is_completed_by_the_models_own():
    """As transformers merges them: the model's saved gnmt_alpha and num_beams fill what the given config leaves
    unset, so the call decodes with the paper's search."""
    from transformers import GenerationConfig

    model, source = tiny_model(), random_ids(2, 5)
    model.generation_config.update(num_beams=4, gnmt_alpha=0.6, allow_custom_entries=True)
    given = model.generate(source, generation_config=GenerationConfig(max_new_tokens=6), output_scores=True,
                           return_dict_in_generate=True)
    expected, scores = gnmt_beam_search(model, source, num_beams=4, alpha=0.6, max_new_tokens=6, output_scores=True)
    assert torch.equal(given.sequences, expected) and torch.equal(given.sequences_scores, scores)


def test_a_saved_setting_the_search_does_not_take_is_refused_and_a_saved_min_new_tokens_0_is_honoured():
    model, source = tiny_model(add_final_logits_bias=True), random_ids(1, 5)
    model.final_logits_bias[..., EOS] = 100.0  # EOS first, always
    model.generation_config.update(num_beams=4, gnmt_alpha=0.6, min_new_tokens=0, allow_custom_entries=True)
    assert model.generate(source).tolist() == [[BOS, EOS]]
    model.generation_config.top_k = 5  # sampling's
    message = "does not take top_k: leave it out (the generation config's: pass top_k=None), or pass gnmt_alpha=None"
    with pytest.raises(ValueError, match=re.escape(message)):
        model.generate(source)
    assert model.generate(source, top_k=None).tolist() == [[BOS, EOS]]  # as the message says


def test_generate_applies_the_logits_processors_that_the_call_and_the_generation_config_ask_for():
    """A call's `no_repeat_ngram_size`, a saved `bad_words_ids` (an OPUS-MT model keeps one), a call's own
    `logits_processor`, a prefix function: the search applies the processors transformers builds of them, in its
    order (the config's, then the call's), as gnmt_beam_search does given them; `output_scores` gives each token's
    score as the search processed it (the prefix function told each returned hypothesis's source)."""
    model = tiny_model(seed=1, add_final_logits_bias=True)
    model.final_logits_bias[0, EOS] = -1e9  # long outputs, which repeat themselves
    model.generation_config.update(num_beams=4, gnmt_alpha=0.6, allow_custom_entries=True)
    source = random_ids(2, 6, seed=3)

    def search(*processors):
        return gnmt_beam_search(model, source, num_beams=4, alpha=0.6, max_new_tokens=20,
                                logits_processor=LogitsProcessorList(processors))

    plain = model.generate(source, max_new_tokens=20)
    assert torch.equal(plain, search())
    assert any(repeats_a_bigram(row[:i]) & {row[i]} for row in plain.tolist() for i in range(2, len(row)))
    once = model.generate(source, max_new_tokens=20, no_repeat_ngram_size=2)
    assert torch.equal(once, search(NoRepeatNGramLogitsProcessor(2)))
    assert not any(repeats_a_bigram(row[:i]) & {row[i]} for row in once.tolist() for i in range(2, len(row)))
    common = int(plain[:, 1:].flatten().mode().values)
    model.generation_config.bad_words_ids = [[common]]
    never = SuppressTokensLogitsProcessor([int(plain[0, 2])])
    both = model.generate(source, max_new_tokens=20, logits_processor=LogitsProcessorList([never]))
    assert torch.equal(both, search(NoBadWordsLogitsProcessor([[common]], eos_token_id=EOS), never))
    assert not {common, int(plain[0, 2])} & set(both[:, 1:].flatten().tolist())
    denied = int(both[:, 1:].flatten().mode().values)  # the token both sources use most, denied to the first alone

    def prefix(row, ids):
        return [t for t in range(model.config.vocab_size) if row == 1 or t != denied]

    constrained = model.generate(source, max_new_tokens=20, prefix_allowed_tokens_fn=prefix, num_return_sequences=2)
    assert torch.equal(constrained, gnmt_beam_search(
        model, source, num_beams=4, alpha=0.6, max_new_tokens=20, num_return_sequences=2,
        logits_processor=LogitsProcessorList([NoBadWordsLogitsProcessor([[common]], eos_token_id=EOS),
                                              PrefixConstrainedLogitsProcessor(prefix, num_beams=4)])))
    assert denied not in constrained[:2, 1:] and denied in constrained[2:, 1:]  # each row's own source told
    # Each token's score as the search had it, processed: the transitions add up to its penalized scores' log P.
    out = model.generate(source, max_new_tokens=20, prefix_allowed_tokens_fn=prefix, num_return_sequences=2,
                         no_repeat_ngram_size=2, output_scores=True, return_dict_in_generate=True)
    transitions = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    assert transitions.isfinite().all() and out.sequences.shape[1] == 21  # none ended: all cut at 20 tokens
    torch.testing.assert_close(transitions.sum(-1) / gnmt_length_penalty(20, 0.6), out.sequences_scores, rtol=1e-5,
                               atol=0)


def test_generate_asks_the_stopping_criteria_that_the_call_and_the_generation_config_ask_for():
    """`stop_strings` read with the call's `tokenizer`, and a call's own `stopping_criteria`: the search asks the
    criteria transformers builds of them, as gnmt_beam_search does given them; `output_scores` ends each hypothesis's
    steps where a criterion stopped it, and its tokens' scores add up to its penalized score's log P."""
    model = tiny_model(seed=1, add_final_logits_bias=True)
    model.final_logits_bias[0, EOS] = -1e9  # outputs that EOS never ends
    model.generation_config.update(num_beams=4, gnmt_alpha=0.6, allow_custom_entries=True)
    source = random_ids(2, 6, seed=3)
    words = Tokenizer(WordLevel({"abcdef": PAD} | {f"w{i}": i for i in range(1, model.config.vocab_size)}, "abcdef"))
    words.decoder = decoders.Fuse()  # (StopStringCriteria reads each token's string after the word "abcdef")
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=words)  # token i > 0 is the string "w{i}", tokens joined

    def search(stop):
        return gnmt_beam_search(model, source, num_beams=4, alpha=0.6, max_new_tokens=12, num_return_sequences=2,
                                stopping_criteria=StoppingCriteriaList([EndsWith(stop)]))

    plain = model.generate(source, max_new_tokens=12, num_return_sequences=2)
    first, second = plain[0, 3].item(), plain[0, 4].item()
    by_string = model.generate(source, max_new_tokens=12, num_return_sequences=2, stop_strings=[f"w{first}"],
                               tokenizer=tokenizer)
    assert torch.equal(by_string, search((first,))) and not torch.equal(by_string, plain[:, : by_string.shape[1]])
    model.generation_config.stop_strings = [f"w{first}w{second}"]  # two tokens, saved: the call gives the tokenizer
    assert torch.equal(model.generate(source, max_new_tokens=12, num_return_sequences=2, tokenizer=tokenizer),
                       search((first, second)))
    model.generation_config.stop_strings = None
    out = model.generate(source, max_new_tokens=12, num_return_sequences=2, output_scores=True,
                         return_dict_in_generate=True, stopping_criteria=StoppingCriteriaList([EndsWith((first,))]))
    assert torch.equal(out.sequences, by_string)
    lengths = torch.tensor([len(hypothesis) for hypothesis in hypotheses(out.sequences, (first,))])
    assert lengths.min() < 12 and torch.equal((out.beam_indices >= 0).sum(-1), lengths)
    transitions = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    torch.testing.assert_close(transitions.sum(-1) / gnmt_length_penalty(lengths, 0.6), out.sequences_scores,
                               rtol=1e-5, atol=0)
    # Asked of every source's 2K candidates at every step, as a criterion that keeps rows apart may need: a source
    # done early (a shorter limit) stays in the batch.
    mask, seen = torch.tensor([[1, 1, 1, 0, 0, 0], [1] * 6]), Seen()
    asked = model.generate(source, attention_mask=mask, extra_length=2, stopping_criteria=StoppingCriteriaList([seen]))
    assert seen.rows == [2 * 8] * 8  # until the longer limit, 6 + 2 tokens
    assert torch.equal(asked, model.generate(source, attention_mask=mask, extra_length=2))


class Seen(StoppingCriteria):
    """A stopping criterion that stops nothing and keeps the number of rows it was asked of, call by call."""

    def __init__(self):
        self.rows = []

    def __call__(self, input_ids: torch.LongTensor, scores, **kwargs) -> torch.BoolTensor:
        self.rows.append(input_ids.shape[0])
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)


def test_generate_continues_each_sources_given_beginning_as_the_search_of_it_alone():
    """`generate(decoder_input_ids=...)`: each output begins with its source's given tokens (the start token put first
    where no row has it, as transformers does; a decoder_attention_mask of ones taken) and continues them as the search
    of that source alone, with processors (no repeated bigram: no source leaves the batch) and without (sources leave
    it); `max_length` and `min_length` count the beginning; the transitions add up to the penalized scores, and the
    first step's hidden states are the whole beginning's, as in transformers' first step; a padded or an empty
    beginning, or one per row of another batch, is refused in one line."""
    model = tiny_model(seed=2)
    model.generation_config.update(num_beams=3, gnmt_alpha=0.6, allow_custom_entries=True)
    source, mask = random_ids(2, 5, seed=5), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    begun = random_ids(2, 2, seed=6)
    out = model.generate(source, attention_mask=mask, decoder_input_ids=begun, num_return_sequences=2,
                         decoder_attention_mask=torch.ones_like(begun), output_scores=True, no_repeat_ngram_size=2,
                         output_hidden_states=True, return_dict_in_generate=True)
    assert (out.sequences[:, 0] == BOS).all() and torch.equal(out.sequences[:, 1:3], begun.repeat_interleave(2, 0))
    for row in range(2):
        alone = gnmt_beam_search(model, source[row : row + 1, : int(mask[row].sum())], num_beams=3, alpha=0.6,
                                 num_return_sequences=2, logits_processor=LogitsProcessorList(
                                     [NoRepeatNGramLogitsProcessor(2)]),
                                 decoder_input_ids=torch.cat([torch.tensor([[BOS]]), begun[row : row + 1]], 1))
        assert torch.equal(out.sequences[2 * row : 2 * row + 2, : alone.shape[1]], alone)
        assert (out.sequences[2 * row : 2 * row + 2, alone.shape[1] :] == PAD).all()
    plain = model.generate(source, attention_mask=mask, decoder_input_ids=begun)
    for row in range(2):
        alone = gnmt_beam_search(model, source[row : row + 1, : int(mask[row].sum())], num_beams=3, alpha=0.6,
                                 decoder_input_ids=torch.cat([torch.tensor([[BOS]]), begun[row : row + 1]], 1))
        assert torch.equal(plain[row, : alone.shape[1]], alone[0]) and (plain[row, alone.shape[1] :] == PAD).all()
    transitions = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    added = (out.beam_indices >= 0).sum(-1)
    torch.testing.assert_close(transitions.sum(-1) / gnmt_length_penalty(added, 0.6), out.sequences_scores,
                               rtol=1e-5, atol=0)
    assert [tuple(step[0].shape[:2]) for step in out.decoder_hidden_states[:2]] == [(4, 3), (4, 1)]
    assert model.generate(source, decoder_input_ids=begun, max_length=6).shape[1] <= 6
    hasty = tiny_model(seed=2, add_final_logits_bias=True)
    hasty.final_logits_bias[..., EOS] = 100.0  # EOS wherever allowed: min_length, counting the beginning, decides
    hasty.generation_config.update(num_beams=3, gnmt_alpha=0.6, allow_custom_entries=True)
    assert hasty.generate(source, decoder_input_ids=begun, min_length=6).shape[1] == 7  # EOS the 7th token
    with pytest.raises(ValueError, match="does not take decoder_attention_mask: leave it out"):
        model.generate(source, decoder_input_ids=begun, decoder_attention_mask=torch.tensor([[0, 1], [1, 1]]))
    with pytest.raises(ValueError, match=r"^decoder_input_ids is empty \(shape \(2, 0\)\)"):
        model.generate(source, decoder_input_ids=begun[:, :0])
    with pytest.raises(ValueError, match=r"^decoder_input_ids has 3 rows for 2 sources: give one beginning per"):
        model.generate(source, decoder_input_ids=random_ids(3, 2, seed=6))


def test_exponential_decay_length_penalty_is_transformers_processor_applied_by_the_search():
    """`exponential_decay_length_penalty` (EOS made likelier after a number of tokens) is transformers' processor,
    counting the generated tokens as transformers' does for an encoder-decoder (after a given beginning too): the
    outputs end sooner."""
    model = tiny_model(seed=1)
    model.generation_config.update(num_beams=4, gnmt_alpha=0.6, allow_custom_entries=True)
    source = random_ids(2, 6, seed=3)
    decayed = model.generate(source, exponential_decay_length_penalty=(2, 3.0))
    expected = gnmt_beam_search(model, source, num_beams=4, alpha=0.6, logits_processor=LogitsProcessorList(
        [ExponentialDecayLengthPenalty((2, 3.0), EOS, input_ids_seq_length=1)]))
    assert torch.equal(decayed, expected) and decayed.shape[1] < model.generate(source).shape[1]
    begun = torch.cat([torch.full((2, 1), BOS), random_ids(2, 2, seed=6)], 1)  # counted from the beginning's end
    assert torch.equal(model.generate(source, decoder_input_ids=begun, exponential_decay_length_penalty=(2, 3.0)),
                       gnmt_beam_search(model, source, num_beams=4, alpha=0.6, decoder_input_ids=begun,
                                        logits_processor=LogitsProcessorList([ExponentialDecayLengthPenalty(
                                            (2, 3.0), EOS, input_ids_seq_length=3)])))


def test_a_watermark_is_transformers_processor_applied_by_the_search_and_its_detector_finds_it():
    """`watermarking_config` (Kirchenbauer et al.'s: a bias on a "green" part of the vocabulary drawn from each row's
    previous token) is transformers' processor, applied by the search as it applies any: the outputs are the search's
    given it, and transformers' detector finds its mark in them, not in the unmarked ones. SynthID's, whose processor
    keeps each row's past from call to call (and so misreads beams that change places), is refused in one line."""
    model = tiny_model(seed=1, add_final_logits_bias=True)
    model.final_logits_bias[0, EOS] = -1e9  # long outputs, for the detector to count
    model.generation_config.update(num_beams=4, gnmt_alpha=0.6, allow_custom_entries=True)
    source, mark = random_ids(2, 6, seed=3), WatermarkingConfig(bias=5.0)
    marked = model.generate(source, max_new_tokens=20, watermarking_config=mark)
    assert torch.equal(marked, gnmt_beam_search(
        model, source, num_beams=4, alpha=0.6, max_new_tokens=20,
        logits_processor=LogitsProcessorList([WatermarkLogitsProcessor(model.config.vocab_size, "cpu", bias=5.0)])))
    detector = WatermarkDetector(model.config, "cpu", mark)
    assert detector(marked[:, 1:], return_dict=True).prediction.all()
    assert not detector(model.generate(source, max_new_tokens=20)[:, 1:], return_dict=True).prediction.any()
    refusal = "SynthID's watermarking_config keeps each row's past from step to step, which the paper's beam search"
    with pytest.raises(ValueError, match="^" + re.escape(refusal)):
        model.generate(source, watermarking_config=SynthIDTextWatermarkingConfig(keys=[5, 7], ngram_len=2))


def test_forced_eos_token_id_ends_each_hypothesis_at_its_own_sources_limit():
    """A saved `forced_eos_token_id` (every OPUS-MT model keeps one) is transformers' forced EOS at each source's own
    limit (its length + `extra_length`), not at one max_length for all: with EOS never chosen, every hypothesis
    ends with EOS as its limit's token, after a given beginning too; each source's are the search's of it alone with
    transformers' own processor at its limit; `output_scores` add up to the penalized scores."""
    model = tiny_model(add_final_logits_bias=True)
    model.final_logits_bias[..., EOS] = -30.0  # no hypothesis ends before its limit
    model.generation_config.update(num_beams=3, gnmt_alpha=0.6, extra_length=2, allow_custom_entries=True)
    source, mask = random_ids(2, 5, seed=4), torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    cut = model.generate(source, attention_mask=mask, num_return_sequences=2)
    assert (cut[:, -1] != EOS).all()
    model.generation_config.forced_eos_token_id = EOS
    out = model.generate(source, attention_mask=mask, num_return_sequences=2, output_scores=True,
                         return_dict_in_generate=True)
    for row, limit in enumerate([5, 5, 7, 7]):  # 3 and 5 source tokens, + 2
        assert out.sequences[row, limit] == EOS and (out.sequences[row, limit + 1 :] == PAD).all()
        alone = source[row // 2 : row // 2 + 1, : limit - 2]
        forced = LogitsProcessorList([ForcedEOSTokenLogitsProcessor(limit + 1, EOS)])  # max_length counts BOS
        expected = gnmt_beam_search(model, alone, num_beams=3, alpha=0.6, max_new_tokens=limit,
                                    num_return_sequences=2, logits_processor=forced)[row % 2]
        assert out.sequences[row, : limit + 1].tolist() == expected.tolist()
    transitions = model.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    lengths = torch.tensor([5, 5, 7, 7])
    torch.testing.assert_close(transitions.sum(-1) / gnmt_length_penalty(lengths, 0.6), out.sequences_scores,
                               rtol=1e-5, atol=0)
    begun = model.generate(source, attention_mask=mask, decoder_input_ids=random_ids(2, 2, seed=6))  # limits: added
    assert begun[0, 2 + 5] == begun[1, 2 + 7] == EOS and (begun[0, 2 + 5 + 1 :] == PAD).all()


def test_one_beam_applies_the_processors_to_the_logits_as_transformers_greedy_search_does():
    """Beam search processes log-probabilities, greedy search the logits (transformers' both); a repetition penalty
    tells them apart. The search with one beam (vaswani-translate's, the ONNX engine's) chooses the tokens of
    transformers' greedy search, which `generate()` runs for one beam; with more beams, those of the search given the
    processor on log-probabilities."""
    model = tiny_model()
    model.generation_config.update(num_beams=1, gnmt_alpha=0.6, allow_custom_entries=True)
    source = random_ids(8, 6, seed=3)
    penalty = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(1.5)])
    greedy = model.generate(source, repetition_penalty=1.5, max_new_tokens=12)
    found = gnmt_beam_search(model, source, num_beams=1, alpha=0.6, max_new_tokens=12, logits_processor=penalty)
    assert torch.equal(found, greedy)
    on_log_probs = gnmt_beam_search(model, source, num_beams=1, alpha=0.6, max_new_tokens=12,
                                    logits_processor=LogitsProcessorList([OnLogProbs(penalty)]))
    assert not torch.equal(on_log_probs, greedy)  # (a penalty that tells the two apart)
    beams = model.generate(source, num_beams=4, repetition_penalty=1.5, max_new_tokens=12)
    assert torch.equal(beams, gnmt_beam_search(model, source, num_beams=4, alpha=0.6, max_new_tokens=12,
                                               logits_processor=LogitsProcessorList([OnLogProbs(penalty)])))


class OnLogProbs(LogitsProcessor):
    """`processors` given log-probabilities in place of logits, as beam search gives them."""

    def __init__(self, processors):
        self.processors = processors

    def __call__(self, input_ids, scores):
        return self.processors(input_ids, scores.log_softmax(-1))


def test_one_beam_of_the_papers_decoding_runs_to_the_longest_unpadded_source_plus_extra_length():
    model = tiny_model(add_final_logits_bias=True)
    model.final_logits_bias[..., 7] = 100.0  # never EOS: every output runs to its limit
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 0]])
    output = model.generate(random_ids(2, 6), attention_mask=mask, num_beams=1, gnmt_alpha=0.6, extra_length=1)
    assert output.shape == (2, 1 + 3 + 1)
