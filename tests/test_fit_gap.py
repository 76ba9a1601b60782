"""benchmarks/fit_gap.py: each model's NLL on a sample of its training pairs and on validation, per target token and
per sentence, against the model's own cross-entropy summed sentence by sentence; the peer read from the folder that
benchmarks/marian_baseline.py writes."""

import json
import os
import random
import sys

import pytest
import torch
from support import multi30k_folder, summed_nll
from transformers import AutoTokenizer, MarianMTModel, PreTrainedTokenizerFast

from vaswani_hf import VaswaniForConditionalGeneration
from vaswani_hf.tools.text import read_lines

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import fit_gap
import marian_baseline


def split(data, name: str) -> list[tuple[str, str]]:
    return list(zip(read_lines(data / f"{name}.en"), read_lines(data / f"{name}.de"), strict=True))


def own_nll(model, tokenizer, pairs) -> dict:
    total, tokens = summed_nll(model, tokenizer, pairs)
    return {"per_token": total / tokens, "per_sentence": total / len(pairs)}


def report(monkeypatch, capsys, *args) -> list[dict]:
    monkeypatch.setattr(sys, "argv", ["fit_gap.py", *map(str, args)])
    fit_gap.main()
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()[1:]]


def test_each_models_nll_is_its_own_cross_entropy_on_training_pairs_and_validation(translation_folder, tmp_path,
                                                                                 monkeypatch, capsys):
    data, peer = tmp_path / "data", tmp_path / "marian"
    multi30k_folder(data, train_pairs=40)
    training, valid = split(data, "train"), split(data, "valid")
    tokenizer = marian_baseline.byte_level_bpe([side for pair in training for side in pair])
    torch.manual_seed(0)
    marian_baseline.small_marian(tokenizer).save_pretrained(peer / "model")  # as the peer's run saves it
    tokenizer.save_pretrained(peer / "tokenizer")
    lines = report(monkeypatch, capsys, translation_folder, "--peer", peer, "--data", data, "--sample", 10)

    models = {"ours": (VaswaniForConditionalGeneration.from_pretrained(translation_folder).eval(),
                       AutoTokenizer.from_pretrained(translation_folder)),
              "peer": (MarianMTModel.from_pretrained(peer / "model").eval(),
                       PreTrainedTokenizerFast.from_pretrained(peer / "tokenizer"))}
    sample = random.Random(0).sample(training, 10)
    assert [line["model"] for line in lines] == ["ours", "peer"]
    for line in lines:
        fit, held_out = (own_nll(*models[line["model"]], pairs) for pairs in (sample, valid))
        for got, expected in ((line["train_sample"], fit), (line["valid"], held_out)):
            assert got["per_token"] == pytest.approx(expected["per_token"], abs=1e-4)  # printed to 4 places
            assert got["per_sentence"] == pytest.approx(expected["per_sentence"], abs=0.01)
        assert line["gap_nats_a_sentence"] == pytest.approx(held_out["per_sentence"] - fit["per_sentence"], abs=0.02)


def test_a_peer_folder_without_its_model_is_refused_before_anything_loads(translation_folder, tmp_path, monkeypatch,
                                                                         capsys):
    (tmp_path / "marian" / "tokenizer").mkdir(parents=True)  # what ../shared/baselines/train_marian.py leaves
    with pytest.raises(SystemExit, match=r"marian/model/config.json not found: is .* a finished run's folder\?"):
        report(monkeypatch, capsys, translation_folder, "--peer", tmp_path / "marian", "--data", tmp_path / "none")
