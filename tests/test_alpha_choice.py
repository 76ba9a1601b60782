"""benchmarks/alpha_choice.py: corpus BLEU from per-sentence statistics against sacreBLEU's own corpus score; the split
halves: α chosen on one half scored on the other (against sacreBLEU on the same split), and on hypotheses whose better
α is known (the references themselves); the command's report on a run decoded by a stand-in of known quality, and its
refusals before any decoding."""

import json
import random
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from sacrebleu.metrics import BLEU

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import alpha_choice
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


def run_main(monkeypatch, capsys, arguments: list[str], calls: list) -> list[dict]:
    """alpha_choice.py's main() on `arguments`, decoding by a stand-in of known quality: α 1.4 writes the references
    themselves, any other α drops half their words. `calls` fills with its calls' keyword arguments; the printed
    rows come back."""
    def translate(model, tokenizer, sources, **kwargs):
        calls.append(kwargs)
        return list(REFERENCES[: len(sources)]) if kwargs["alpha"] == 1.4 else degraded(0.5, 0)[: len(sources)]

    monkeypatch.setattr(alpha_choice, "translate", translate)
    monkeypatch.setattr(sys, "argv", ["alpha_choice.py", *arguments])
    alpha_choice.main()
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]


def text_files(tmp_path, lines: int) -> list[str]:
    (tmp_path / "v.en").write_text("".join(f"source {i}\n" for i in range(len(REFERENCES))), encoding="utf-8")
    (tmp_path / "v.de").write_text("".join(line + "\n" for line in REFERENCES[:lines]), encoding="utf-8")
    return ["--source", str(tmp_path / "v.en"), "--reference", str(tmp_path / "v.de")]


def test_each_run_decodes_its_candidates_with_4_beams_and_reports_them_against_the_best(translation_folder, tmp_path,
                                                                                        monkeypatch, capsys):
    """A run's own α candidates (its metrics.json) when --alphas is not given; BLEU, the length ratio (hypothesis over
    reference words, as sacreBLEU counts them) and each α's p-value against the best, the best left out."""
    run = tmp_path / "run"
    shutil.copytree(translation_folder, run)
    (run / "metrics.json").write_text(json.dumps({"alpha_search": [0.6, 1.4]}), encoding="utf-8")
    calls = []
    (row,) = run_main(monkeypatch, capsys, [str(run), "--splits", "5", *text_files(tmp_path, 32)], calls)
    assert [(call["alpha"], call["num_beams"]) for call in calls] == [(0.6, 4), (1.4, 4)]
    worse = BLEU().corpus_score(degraded(0.5, 0), [REFERENCES])
    assert row["bleu"] == {"0.6": round(worse.score, 2), "1.4": 100.0}
    assert row["length_ratio"] == {"0.6": round(worse.sys_len / worse.ref_len, 3), "1.4": 1.0}
    assert list(row["p_against_best"]) == ["0.6"] and row["p_against_best"]["0.6"] < 0.05


@pytest.mark.parametrize(("empty", "options", "lines", "message"), [
    (False, ["--alphas", "0.6,-1"], 32, "α must be at least 0, not 0.6,-1"),
    (False, ["--splits", "0"], 32, "must be at least 1, not 0"),
    (True, [], 32, "{empty}: not a training/run.py output folder (no config.json)"),
    (False, [], 31, "has 32 lines but"),
])
def test_a_wrong_request_is_one_line_before_any_decoding(translation_folder, tmp_path, monkeypatch, capsys, empty,
                                                         options, lines, message):
    (tmp_path / "empty").mkdir()
    run = tmp_path / "empty" if empty else translation_folder
    calls = []
    with pytest.raises(SystemExit) as raised:
        run_main(monkeypatch, capsys, [str(run), "--alphas", "1.4", *options, *text_files(tmp_path, lines)], calls)
    assert message.format(empty=tmp_path / "empty") in str(raised.value) + capsys.readouterr().err
    assert calls == []
