"""benchmarks/alpha_choice.py: corpus BLEU from per-sentence statistics against sacreBLEU's own corpus score; the split
halves: α chosen on one half scored on the other (against sacreBLEU on the same split), and on hypotheses whose better
α is known (the references themselves)."""

import random
import sys
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from alpha_choice import corpus_bleu, sentence_statistics, split_halves

REFERENCES = [
    "Ein Mann fährt auf einem Fahrrad die Straße entlang .",
    "Zwei Hunde spielen im Schnee .",
    "Eine Frau in einem roten Kleid singt auf einer Bühne .",
    "Kinder spielen Fußball auf einer grünen Wiese .",
    "Ein alter Mann sitzt auf einer Bank im Park und liest Zeitung .",
    "Eine Gruppe von Menschen wartet an einer Bushaltestelle .",
    "Ein Junge springt von einem Felsen in das Wasser .",
    "Zwei Frauen unterhalten sich in einem Café .",
] * 4


def degraded(drop: float, seed: int) -> list[str]:
    """The references with each word dropped with probability `drop`: hypotheses of a known quality."""
    rng = random.Random(seed)
    return [" ".join(word for word in line.split() if rng.random() >= drop) for line in REFERENCES]


@pytest.mark.parametrize("seed", range(5))
def test_corpus_bleu_of_any_subset_is_sacrebleus(seed):
    hypotheses = degraded(0.3, seed)
    statistics = sentence_statistics(hypotheses, REFERENCES)
    subset = random.Random(seed).sample(range(len(REFERENCES)), len(REFERENCES) // 2)
    expected = BLEU().corpus_score([hypotheses[i] for i in subset], [[REFERENCES[i] for i in subset]]).score
    assert corpus_bleu(statistics[subset]) == pytest.approx(expected, abs=1e-9)


def test_split_halves_choose_the_clearly_better_alpha():
    decoded = {1.0: degraded(0.6, 1), 1.4: list(REFERENCES)}
    statistics = {alpha: sentence_statistics(hypotheses, REFERENCES) for alpha, hypotheses in decoded.items()}
    result = split_halves(statistics, splits=20, seed=0)
    assert result["halves_agree"] == 1.0
    assert result["held_out_bleu"]["chosen"] == result["held_out_bleu"]["1.4"] == 100.0


def test_alpha_chosen_on_one_half_is_scored_on_the_other():
    """One split, scored again with sacreBLEU's corpus score: each half's choice is scored on the other half."""
    decoded = {1.0: degraded(0.3, 4), 1.4: degraded(0.3, 5)}  # alike in quality, unlike sentence by sentence
    statistics = {alpha: sentence_statistics(hypotheses, REFERENCES) for alpha, hypotheses in decoded.items()}
    result = split_halves(statistics, splits=1, seed=0)
    order = np.random.default_rng(0).permutation(len(REFERENCES))  # the split the function draws from its seed
    halves = order[: len(order) // 2], order[len(order) // 2:]

    def bleu(alpha, half):
        return BLEU().corpus_score([decoded[alpha][i] for i in half], [[REFERENCES[i] for i in half]]).score

    choices = [max(decoded, key=lambda alpha, half=half: bleu(alpha, half)) for half in halves]
    assert choices[0] != choices[1]  # the halves disagree here, so scoring a choice on its own half would differ
    assert result["halves_agree"] == 0.0
    expected = (bleu(choices[0], halves[1]) + bleu(choices[1], halves[0])) / 2
    assert result["held_out_bleu"]["chosen"] == pytest.approx(expected, abs=0.006)  # reported to 2 decimals
