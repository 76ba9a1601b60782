"""benchmarks/multi30k.py, the README's side by side: the commands it starts, and what it reads back and scores. Its
two training processes are stand-ins that write what training/run.py and the peer's script write (their own tests run
them); the scores are checked against sacreBLEU on the sentences each set must hold, listed here by hand."""

import json
import os
import shutil
import sys

import pytest
from sacrebleu.metrics import BLEU
from support import multi30k_folder

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import multi30k

# Validation: sentence i's source is a word of its own, OWN[i], then "the" up to LENGTHS[i] words (sentence 1's one
# word is longer in characters than sentence 2's eight: lengths are counted in words). Training counts make
# sentences 2 and 4 the rarest quarter: r2 is never seen, r4 once; r3 is seen 8 times, all capitalized ("R3"), so
# that only words compared lowercased leave sentence 3 out. "the" is in every sentence: ordering sentences by the sum
# of their words' counts, not by their rarest word first, picks the shortest instead.
OWN = ["r0", "r1" + "o" * 30, "r2", "r3", "r4", "r5", "r6", "r7"]
LENGTHS = [3, 1, 8, 5, 2, 7, 4, 6]
TRAINING_COUNTS = {"r0": 5, "R3": 8, OWN[1]: 3, "r4": 1, "r5": 6, "r6": 2, "r7": 7, "the": 50}
QUARTILES = [[1, 4], [0, 6], [3, 7], [2, 5]]  # by source words: 1-2, 3-4, 5-6, 7-8
RARE = [2, 4]
TEST_LENGTHS = [6, 2, 4, 8, 1, 3, 7, 5]
TEST_QUARTILES = [[1, 4], [2, 5], [0, 7], [3, 6]]
# Each model's translation is its reference on these sentences, and shares nothing with it on the others.
RIGHT = {("ours", "valid"): {2, 4, 5, 6}, ("peer", "valid"): {0, 1, 3, 4},
         ("ours", "test2016"): {0, 3, 5}, ("peer", "test2016"): {0, 1, 3, 4}}


def sentences(lengths: list[int]) -> list[str]:
    return [" ".join([OWN[i]] + ["the"] * (length - 1)) for i, length in enumerate(lengths)]


def references(split: str) -> list[str]:
    return [f"{split} satz {i} hat fünf wörter und mehr" for i in range(8)]


def translations(model: str, split: str) -> list[str]:
    return [line if i in RIGHT[model, split] else "ganz anders als gemeint hier"
            for i, line in enumerate(references(split))]


def bleu(model: str, split: str, rows: list[int]) -> float:
    found = translations(model, split)
    return BLEU().corpus_score([found[i] for i in rows], [[references(split)[i] for i in rows]]).score


def stand_in(started: list, splits: list[str]):
    """multi30k.run's stand-in: records each command and writes what that process would have written."""

    def run(command, log):
        started.append(command)
        if "training/run.py" in command:
            out = multi30k.Path(command[command.index("--output_dir") + 1])
            out.mkdir()
            metrics = {"train_steps": 700, "validation": {"bleu": 41.5}}
            if "--test_file" in command:
                metrics["test"] = {"bleu": 40.5}
            (out / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")
            (out / "generation_config.json").write_text(json.dumps({"gnmt_alpha": 1.4}), encoding="utf-8")
            for split in splits:  # ours' translations, as translations() writes them once decoded
                (out / f"{split}.hyp.de").write_text("".join(line + "\n" for line in translations("ours", split)),
                                                     encoding="utf-8")
        else:
            out = multi30k.Path(command[command.index("--out") + 1])
            out.mkdir()
            scores = {"valid_beam4": {"bleu": 30.5}, "valid_beam1": {"bleu": 29.5},
                      "test2016_beam4": {"bleu": 31.5}}
            (out / "results.json").write_text(json.dumps({"train": {"steps": 90}, "eval": scores}), encoding="utf-8")
            for split in splits:
                (out / f"{split}_beam4.hyp.de").write_text(
                    "".join(line + "\n" for line in translations("peer", split)), encoding="utf-8")
                (out / f"{split}_beam1.hyp.de").write_text("".join(line + "\n" for line in references(split)),
                                                           encoding="utf-8")

    return run


@pytest.mark.parametrize(("flags", "minutes", "peer_minutes"), [
    ([], "2.0", "2.0"), (["--peer_minutes", "3"], "2.0", "3.0"), (["--no_test", "--skip_peer"], "2.0", None)])
def test_the_side_by_side_scores_each_models_translations_on_the_sets_it_names(tmp_path, monkeypatch, capsys, flags,
                                                                                minutes, peer_minutes):
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en").write_text("".join(f"{word} {word}\n" * (count // 2) + f"{word}\n" * (count % 2)
                                           for word, count in TRAINING_COUNTS.items()), encoding="utf-8")
    for split, lengths in (("valid", LENGTHS), ("test2016", TEST_LENGTHS)):
        (data / f"{split}.en").write_text("".join(line + "\n" for line in sentences(lengths)), encoding="utf-8")
        (data / f"{split}.de").write_text("".join(line + "\n" for line in references(split)), encoding="utf-8")
    splits = ["valid"] if "--no_test" in flags else ["valid", "test2016"]
    started, out = [], tmp_path / "out"
    monkeypatch.setattr(multi30k, "run", stand_in(started, splits))
    monkeypatch.setattr(sys, "argv", ["multi30k.py", "--data", str(data), "--minutes", "2", "--preset", "cpu-small",
                                      "--output_dir", str(out), *flags, "--", "--warmup_share", "0.2"])
    multi30k.main()

    test_file = [] if "--no_test" in flags else ["--test_file", str(data / "test2016")]
    assert started[0] == ["accelerate", "launch", "--num_processes", "1", "training/run.py", "--preset", "cpu-small",
                          "--train_file", str(data / "train"), "--validation_file", str(data / "valid"), *test_file,
                          "--max_train_minutes", minutes, "--output_dir", str(out / "ours"), "--warmup_share", "0.2"]
    assert started[1:] == ([[sys.executable, str(multi30k.PEER), "--data", str(data), "--budget_min", peer_minutes,
                             "--out", str(out / "marian")]] if peer_minutes else [])

    comparison = json.loads((out / "comparison.json").read_text(encoding="utf-8"))
    ours = comparison["rows"]["ours (cpu-small)"]
    assert (ours["steps"], ours["valid"], ours["alpha"]) == (700, {"bleu": 41.5}, 1.4)
    assert ours.get("test2016") == (None if "--no_test" in flags else {"bleu": 40.5})
    models = {"ours": ours}
    if peer_minutes:
        models["peer"] = peer = comparison["rows"]["MarianMTModel + Seq2SeqTrainer"]
        assert (peer["steps"], peer["valid"], peer["test2016"]) == (90, {"bleu": 30.5}, {"bleu": 31.5})
    for model, row in models.items():
        assert row["valid_long"] == bleu(model, "valid", QUARTILES[3])
        assert row["valid_rare"] == bleu(model, "valid", RARE)
        for split, quartiles in (("valid", QUARTILES), ("test2016", TEST_QUARTILES))[:len(splits)]:
            assert row[f"{split}_by_length"] == {
                "bleu": bleu(model, split, list(range(8))),
                "quartiles": [bleu(model, split, rows) for rows in quartiles],
                "quartile_words": [[1, 2], [3, 4], [5, 6], [7, 8]]}
    if "--no_test" in flags:
        assert "test2016_by_length" not in ours
        return

    printed = capsys.readouterr().out
    test_bleu = ours["test2016_by_length"]["bleu"]
    assert f"| {ours['valid_long']:>10.2f} | {ours['valid_rare']:>10.2f} | {test_bleu:>8.2f} |" in printed
    margins = {"valid": 41.5 - 30.5, "valid-long": ours["valid_long"] - peer["valid_long"],
               "valid-rare": ours["valid_rare"] - peer["valid_rare"],
               "test2016": test_bleu - peer["test2016_by_length"]["bleu"]}
    margins |= {f"test2016 Q{k + 1}": bleu("ours", "test2016", rows) - bleu("peer", "test2016", rows)
                for k, rows in enumerate(TEST_QUARTILES)}
    assert "ours - peer, sacreBLEU: " + ", ".join(f"{name} {m:+.2f}" for name, m in margins.items()) in printed

    monkeypatch.setattr(sys, "argv", ["multi30k.py", "--data", str(data), "--score_only", str(out)])
    multi30k.main()  # an earlier run's folders scored again: nothing trained, the same comparison
    assert len(started) == 2 and json.loads((out / "comparison.json").read_text(encoding="utf-8")) == comparison


def test_ours_are_decoded_once_from_the_saved_model_as_vaswani_translate_decodes_them(tmp_path, monkeypatch, cli,
                                                                                      translation_folder):
    """When the run left no translations, the comparison decodes each split's sources from the run's folder: what
    `vaswani-translate` writes for that file, line for line; a second scoring reads them back, decoding nothing."""
    data = tmp_path / "data"
    multi30k_folder(data, train_pairs=20)
    out = tmp_path / "out"

    def run(command, log):  # training/run.py's stand-in: its output folder is a trained run's
        shutil.copytree(translation_folder, out / "ours")
        (out / "ours" / "metrics.json").write_text(json.dumps({"train_steps": 5, "validation": {"bleu": 1.0}}),
                                                   encoding="utf-8")

    monkeypatch.setattr(multi30k, "run", run)
    monkeypatch.setattr(sys, "argv", ["multi30k.py", "--data", str(data), "--skip_peer", "--output_dir", str(out)])
    multi30k.main()
    for split, sentences in (("valid", 6), ("test2016", 5)):
        expected = cli("--model", out / "ours", "--input", data / f"{split}.en").stdout.splitlines()
        written = (out / "ours" / f"{split}.hyp.de").read_text(encoding="utf-8").splitlines()
        assert len(expected) == sentences and written == expected

    from vaswani_hf.tools import translate

    monkeypatch.setattr(translate, "load", None)  # nothing loaded to decode again
    monkeypatch.setattr(sys, "argv", ["multi30k.py", "--data", str(data), "--score_only", str(out)])
    multi30k.main()


def test_the_rarest_quarter_breaks_a_tie_of_rarest_words_by_the_next_rarest():
    """Sentences 0 and 1 each hold a word seen once; sentence 1's other word is the rarer (2 against 5): it is the
    quarter (one of four), though the first in order would be 0."""
    training = ["a", "b", "y", "y", "c", "c", "c", "d", "d", "d"] + ["x"] * 5 + ["z"] * 6 + ["w"] * 7
    assert multi30k.rarest_quarter(["a x", "b y", "c z", "d w"], training) == [1]


@pytest.mark.parametrize(("flags", "message"), [
    (["--minutes", "0"], "a training budget must be positive, not 0"),
    (["--no_test"], "--no_test: the peer's script always decodes test2016; add --skip_peer"),
    (["--output_dir", "{existing}"], "--output_dir {existing} exists: name a new one"),
])
def test_a_wrong_request_is_one_line_before_anything_runs(tmp_path, monkeypatch, capsys, flags, message):
    data = tmp_path / "data"
    multi30k_folder(data, 10)
    (tmp_path / "earlier").mkdir()
    flags = [flag.format(existing=tmp_path / "earlier") for flag in flags]
    started = []
    monkeypatch.setattr(multi30k, "run", lambda command, log: started.append(command))
    monkeypatch.setattr(sys, "argv", ["multi30k.py", "--data", str(data), "--output_dir", str(tmp_path / "out"),
                                      *flags])
    with pytest.raises(SystemExit) as raised:
        multi30k.main()
    assert message.format(existing=tmp_path / "earlier") in str(raised.value) + capsys.readouterr().err
    assert started == [] and not (tmp_path / "out").exists()
