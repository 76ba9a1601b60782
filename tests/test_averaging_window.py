"""benchmarks/averaging_window.py: each window's model is the mean of the run's last K checkpoints (as run.py writes
them), its NLL that model's own cross-entropy, its BLEU that model's beam-4 translations scored by sacreBLEU."""

import json
import os
import shutil
import sys

import pytest
import torch
from accelerate import Accelerator
from sacrebleu.metrics import BLEU
from support import accelerate_as_in_a_new_process, multi30k_folder, summed_nll
from transformers import AutoTokenizer

from training.checkpoints import save_checkpoint
from training.evaluation import translate
from vaswani_hf import VaswaniForConditionalGeneration
from vaswani_hf.tools.text import read_lines

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import averaging_window


@pytest.fixture
def run(translation_folder, tmp_path):
    """A run's folder with three checkpoints, steps 10, 20 and 30, each the model moved by its own noise; their
    weights, newest last. Its P_drop is 0.3: a model scored in training mode would show."""
    folder = shutil.copytree(translation_folder, tmp_path / "run")
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    (folder / "config.json").write_text(json.dumps({**config, "dropout": 0.3}), encoding="utf-8")
    model = VaswaniForConditionalGeneration.from_pretrained(folder)
    optimizer = torch.optim.Adam(model.parameters())
    generator, weights = torch.Generator().manual_seed(0), []
    with accelerate_as_in_a_new_process():
        accelerator = Accelerator(cpu=True)
        for step in (10, 20, 30):
            with torch.no_grad():
                for parameter in model.parameters():
                    parameter += 0.05 * torch.randn(parameter.shape, generator=generator)
            weights.append({name: tensor.clone() for name, tensor in model.state_dict().items()})
            save_checkpoint(accelerator, model, optimizer, folder, step, {}, keep=5)
    return folder, weights


def test_each_window_scores_the_mean_of_the_last_checkpoints(run, tmp_path, monkeypatch, capsys):
    folder, weights = run
    data = tmp_path / "data"
    multi30k_folder(data, train_pairs=40)
    monkeypatch.setattr(sys, "argv", ["averaging_window.py", str(folder), "--windows", "2,1", "--alphas", "0.6",
                                      "--source", str(data / "valid.en"), "--reference", str(data / "valid.de"),
                                      "--training_source", str(data / "train.en")])
    averaging_window.main()
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    sources, references = read_lines(data / "valid.en"), read_lines(data / "valid.de")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert [(row["last"], row["from"]) for row in rows] == [(2, "checkpoint-20"), (1, "checkpoint-30")]
    for row, last in zip(rows, (weights[1:], weights[2:]), strict=True):
        model = VaswaniForConditionalGeneration.from_pretrained(folder).eval()
        model.load_state_dict({name: sum(w[name] for w in last) / len(last) for name in last[0]})
        total, tokens = summed_nll(model, tokenizer, zip(sources, references, strict=True))
        assert row["nll"] == pytest.approx(total / tokens, abs=1e-4)
        hypotheses = translate(model, tokenizer, sources, num_beams=4, alpha=0.6)
        assert row["bleu"]["0.6"]["all"] == round(BLEU().corpus_score(hypotheses, [references]).score, 2)


def test_a_window_wider_than_the_run_is_refused_before_anything_loads(run, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["averaging_window.py", str(run[0]), "--windows", "4,1"])
    with pytest.raises(SystemExit, match="3 checkpoints, fewer than the window 4"):
        averaging_window.main()
