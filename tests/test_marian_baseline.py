"""benchmarks/marian_baseline.py, the peer of the Multi30k comparison, as benchmarks/multi30k.py runs it: on a few
pairs of the embedded grammar for a budget of one second, it trains, stops at the budget, and writes the steps,
scores and translations that the comparison reads. The peer's process runs in this one (`commands_run_here`: its
command, then its main() with those arguments), as a process of its own would only add its imports."""

import json
import os
import sys
from types import SimpleNamespace

from sacrebleu.metrics import BLEU
from support import accelerate_as_in_a_new_process, commands_run_here, multi30k_folder

from vaswani_hf.tools.text import read_lines

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import marian_baseline
import multi30k


def test_the_peer_trains_for_its_budget_and_writes_what_the_comparison_reads(tmp_path, monkeypatch):
    data = tmp_path / "data"
    multi30k_folder(data, train_pairs=400)
    out = tmp_path / "marian"
    commands = commands_run_here(monkeypatch, marian_baseline)
    with accelerate_as_in_a_new_process():
        row = multi30k.peer(SimpleNamespace(peer=multi30k.PEER, data=data, peer_minutes=1 / 60), out)
    assert commands == [["--data", str(data), "--budget_min", str(1 / 60), "--out", str(out)]]

    results = json.loads((out / "results.json").read_text())
    assert row["steps"] == results["train"]["steps"] >= 1
    seconds, steps = results["train"]["seconds"], results["train"]["steps"]
    assert 0 <= seconds - 1.0 < 5 * seconds / steps  # stopped at the first step after the budget
    for split, sentences in (("valid", 6), ("test2016", 5)):
        hypotheses = read_lines(out / f"{split}_beam4.hyp.de")
        references = read_lines(data / f"{split}.de")
        assert len(hypotheses) == sentences
        assert row[split]["bleu"] == BLEU().corpus_score(hypotheses, [references]).score  # its file, scored again
    assert len(read_lines(out / "test2016_beam1.hyp.de")) == 5
