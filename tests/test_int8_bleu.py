"""benchmarks/int8_bleu.py: its float32 and int8 rows score what `vaswani-translate` writes without and with `--int8`,
against sacreBLEU; its header names the decoding the folder saved."""

import json
import os
import shutil
import sys

import pytest
import torch
from sacrebleu.metrics import BLEU, CHRF

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import int8_bleu

from training.default_data import generate


@pytest.fixture
def test_set(tmp_path):
    pairs = generate()["test"][:40]
    for name, side in (("source", 0), ("reference", 1)):
        (tmp_path / name).write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    return tmp_path / "source", tmp_path / "reference", [target for _, target in pairs]


def benchmark(monkeypatch, capfd, *args) -> str:
    threads = ["--threads", torch.get_num_threads()]  # the test process's own: the suite checks they are kept
    monkeypatch.setattr(sys, "argv", ["int8_bleu.py", *map(str, [*args, *threads])])
    capfd.readouterr()
    int8_bleu.main()
    return capfd.readouterr().out


def test_each_row_scores_what_vaswani_translate_writes(translation_folder, cli, test_set, monkeypatch, capfd):
    source, reference, references = test_set
    written = {}
    for name, flags in (("float32", []), ("int8", ["--int8"])):
        result = cli("--model", translation_folder, *flags, stdin=source.read_text(encoding="utf-8"))
        assert result.returncode == 0, result.stderr
        written[name] = result.stdout.splitlines()
    assert written["float32"] != written["int8"]  # the rows can be told apart
    rows = {line.split(" | ")[0][2:]: line.strip("| ").split(" | ")
            for line in benchmark(monkeypatch, capfd, translation_folder, "--source", source, "--reference", reference)
            .splitlines() if line.startswith(("| float32", "| int8"))}
    for name, translations in written.items():
        assert rows[name][1] == f"{BLEU().corpus_score(translations, [references]).score:.2f}"
        assert rows[name][2] == f"{CHRF().corpus_score(translations, [references]).score:.2f}"


@pytest.mark.parametrize(("decoding", "named"), [
    ({"num_beams": 3, "gnmt_alpha": 0.8}, "beam 3, GNMT α 0.8"),
    ({"num_beams": 5, "max_new_tokens": 40}, "beam 5, transformers' beam search")])
def test_the_header_names_the_saved_decoding(translation_folder, test_set, tmp_path, monkeypatch, capfd, decoding,
                                             named):
    folder = shutil.copytree(translation_folder, tmp_path / "model")
    config = {key: value for key, value in json.loads((folder / "generation_config.json").read_bytes()).items()
              if key != "gnmt_alpha"}
    (folder / "generation_config.json").write_text(json.dumps({**config, **decoding}), encoding="utf-8")
    source, reference, _ = test_set
    out = benchmark(monkeypatch, capfd, folder, "--source", source, "--reference", reference)
    assert out.splitlines()[0].endswith(f"40 sentences, {named}")


@pytest.mark.parametrize(("which", "message"), [("source", "no such file"), ("lines", "40 sources but 39 references")])
def test_a_wrong_test_set_is_refused_in_one_line(translation_folder, test_set, tmp_path, monkeypatch, capfd, which,
                                                 message):
    source, reference, references = test_set
    if which == "source":
        source = tmp_path / "missing"
    else:
        reference.write_text("".join(line + "\n" for line in references[:39]), encoding="utf-8")
    with pytest.raises(SystemExit, match=message):
        benchmark(monkeypatch, capfd, translation_folder, "--source", source, "--reference", reference)
