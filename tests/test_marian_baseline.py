"""benchmarks/marian_baseline.py, the peer of the Multi30k comparison, as benchmarks/multi30k.py runs it: on a few
pairs of the embedded grammar for a budget of one second, it trains, stops at the budget, and writes the steps,
scores and translations that the comparison reads. The peer's process runs in this one (`commands_run_here`: its
command, then its main() with those arguments), as a process of its own would only add its imports."""

import json
import os
import sys
from types import SimpleNamespace

import pytest
import torch
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
    trainers, searches, generate = [], [], marian_baseline.MarianMTModel.generate

    class Seen(marian_baseline.Seq2SeqTrainer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            trainers.append(self)

    def searched(model, **kwargs):
        searches.append({key: value for key, value in kwargs.items() if key not in ("input_ids", "attention_mask")}
                        | {"width": kwargs["input_ids"].shape[1]})
        return generate(model, **kwargs)

    monkeypatch.setattr(marian_baseline, "Seq2SeqTrainer", Seen)
    monkeypatch.setattr(marian_baseline.MarianMTModel, "generate", searched)
    with accelerate_as_in_a_new_process():
        row = multi30k.peer(SimpleNamespace(peer=multi30k.PEER, data=data, peer_minutes=1 / 60), out)
    assert commands == [["--data", str(data), "--budget_min", str(1 / 60), "--out", str(out)]]

    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    assert row["steps"] == results["train"]["steps"] >= 1
    seconds, steps = results["train"]["seconds"], results["train"]["steps"]
    assert 0 <= seconds - 1.0 < 5 * seconds / steps  # stopped at the first step after the budget
    for split, sentences in (("valid", 6), ("test2016", 5)):
        hypotheses = read_lines(out / f"{split}_beam4.hyp.de")
        references = read_lines(data / f"{split}.de")
        assert len(hypotheses) == sentences
        assert row[split]["bleu"] == BLEU().corpus_score(hypotheses, [references]).score  # its file, scored again
    assert len(read_lines(out / "test2016_beam1.hyp.de")) == 5

    # The recipe its docstring gives, as the comparison's reader takes it: the peer at its full strength.
    (trainer,) = trainers
    config, arguments, tokenizer = trainer.model.config, trainer.args, trainer.processing_class
    assert (config.d_model, config.encoder_layers, config.decoder_layers, config.encoder_attention_heads,
            config.encoder_ffn_dim, config.dropout, config.scale_embedding) == (256, 3, 3, 4, 1024, 0.1, True)
    assert trainer.model.get_input_embeddings().weight is trainer.model.lm_head.weight  # one embedding matrix
    assert (arguments.learning_rate, arguments.lr_scheduler_type, arguments.warmup_steps, arguments.adam_beta1,
            arguments.adam_beta2, arguments.adam_epsilon, arguments.label_smoothing_factor,
            arguments.per_device_train_batch_size) == (1e-3, "inverse_sqrt", 1000, 0.9, 0.98, 1e-9, 0.1, 128)
    assert arguments.train_sampling_strategy == "group_by_length"
    assert tokenizer("Ein Hund.")["input_ids"][-1] == tokenizer.eos_token_id and len(tokenizer) <= 8000
    assert [(search["num_beams"], search["length_penalty"]) for search in searches] == (
        [(4, 0.6)] * 2 + [(1, 1.0)])  # test2016 and valid with beam 4 (5 and 6 sources: one batch each), greedy
    assert all(search["max_new_tokens"] == search["width"] + 50 for search in searches)

    # The NLL per target token, against the model's own loss sentence by sentence (no padding to count or skip).
    model = trainer.model.eval()
    total = count = 0
    with torch.no_grad():
        for source, target in zip(*(read_lines(data / f"valid.{lang}") for lang in ("en", "de")), strict=True):
            labels = tokenizer(target)["input_ids"]
            loss = model(input_ids=torch.tensor([tokenizer(source)["input_ids"]]), labels=torch.tensor([labels])).loss
            total, count = total + loss.item() * len(labels), count + len(labels)
    assert results["eval"]["valid_nll"] == pytest.approx(total / count, rel=1e-4)

    # The trained model and its tokenizer, saved as benchmarks/fit_gap.py --peer reads them.
    saved = marian_baseline.MarianMTModel.from_pretrained(out / "model").state_dict()
    assert saved.keys() == model.state_dict().keys()
    assert all(torch.equal(saved[name], weight) for name, weight in model.state_dict().items())
    reloaded = marian_baseline.PreTrainedTokenizerFast.from_pretrained(out / "tokenizer")
    assert reloaded.get_vocab() == tokenizer.get_vocab()


def test_the_budget_stops_training_at_the_first_step_that_ends_after_it(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(marian_baseline, "time", SimpleNamespace(time=lambda: clock[0]))
    budget, control = marian_baseline.Budget(60.0), SimpleNamespace(should_training_stop=False)
    budget.on_train_begin(None, None, control)
    stops = []
    for ends_at in (130.0, 159.9, 160.0):
        clock[0] = ends_at
        budget.on_step_end(None, None, control)
        stops.append(control.should_training_stop)
    assert stops == [False, False, True] and budget.elapsed == 60.0


def test_each_translation_goes_back_to_its_source_line_and_no_padding_is_written():
    """A stand-in model whose search writes its source back: the translations come back in the sources' order, though
    translated shortest first, 64 to a batch (70 sources: two batches); the search may not write the padding id."""
    lines = [f"Ein {'sehr ' * (i % 7)}kleiner Hund Nummer {i}." for i in range(70)]
    tokenizer = marian_baseline.byte_level_bpe(lines)
    calls = []

    def echo(**kwargs):
        calls.append(kwargs)
        return kwargs["input_ids"]

    found = marian_baseline.translate(SimpleNamespace(generate=echo), tokenizer, lines, 4)
    assert found == lines and [len(call["input_ids"]) for call in calls] == [64, 6]
    assert all(call["bad_words_ids"] == [[tokenizer.pad_token_id]] for call in calls)
