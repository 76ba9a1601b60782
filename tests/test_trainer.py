"""The model under transformers' Seq2SeqTrainer, and training/run_trainer.py, the Trainer entry point."""

import errno
import json
import os
import re
import shutil
import signal
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from accelerate import Accelerator
from forked import ROOT, accelerate_ranks, free_port, run_forked
from safetensors.torch import load_file
from support import (
    accelerate_as_in_a_new_process,
    attention_in_steps,
    run_training,
    save_marian_folder,
    throw,
    tiny_model,
)
from torch.utils.data import SequentialSampler
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    Seq2SeqTrainer,
    Seq2SeqTrainingArguments,
)
from transformers.trainer_utils import EvalPrediction

from training import run_trainer, trainer_checkpoints
from training.arguments import read_preset
from training.checkpoints import save_checkpoint
from training.default_data import generate
from training.evaluation import score, translate
from training.hub import set_paper_decoding
from training.run_trainer import make_compute_metrics, tokenize
from vaswani_hf import VaswaniForConditionalGeneration
from vaswani_hf.gnmt import gnmt_beam_search
from vaswani_hf.modeling_vaswani import shift_tokens_right

TRAINER = ROOT / "training" / "run_trainer.py"


@pytest.fixture(scope="module")
def tokenizer(translation_folder):
    return AutoTokenizer.from_pretrained(translation_folder)


@pytest.fixture(scope="module")
def pairs():
    return generate()["train"][:64]


def trainer_for(tmp_path, tokenizer, train_pairs, model=None, eval_pairs=None, in_order=False, **arguments):
    model = model or tiny_model(seed=5, vocab_size=len(tokenizer))
    defaults = {"output_dir": str(tmp_path), "report_to": "none", "save_strategy": "no", "logging_steps": 1,
                "seed": 0, "use_cpu": True, "dataloader_num_workers": 0, "disable_tqdm": True, "optim": "sgd",
                "learning_rate": 0.1}
    args = Seq2SeqTrainingArguments(**{**defaults, **arguments})
    trainer = Seq2SeqTrainer(
        model=model, args=args, train_dataset=tokenize(tokenizer, train_pairs, 64),
        eval_dataset=tokenize(tokenizer, eval_pairs, 64) if eval_pairs else None,
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model), processing_class=tokenizer,
        compute_metrics=make_compute_metrics(tokenizer, False),
    )
    if in_order:  # batches in dataset order
        trainer._get_train_sampler = lambda *args, **kwargs: SequentialSampler(trainer.train_dataset)
    return trainer


def test_the_collator_makes_decoder_inputs_from_the_labels(tokenizer, pairs):
    model = tiny_model(vocab_size=len(tokenizer))
    features = [dict(row) for row in tokenize(tokenizer, pairs[:3], 64)]
    batch = DataCollatorForSeq2Seq(tokenizer, model=model)(features)
    assert torch.equal(batch["decoder_input_ids"], shift_tokens_right(batch["labels"], tokenizer.pad_token_id,
                                                                      model.config.decoder_start_token_id))
    assert (batch["labels"] == -100).any()  # the shorter targets are padded with -100


def test_label_smoothing_trains(tmp_path, tokenizer, pairs):
    trainer = trainer_for(tmp_path, tokenizer, pairs, label_smoothing_factor=0.1, optim="adamw_torch",
                          learning_rate=3e-3, lr_scheduler_type="constant", weight_decay=0.0,
                          per_device_train_batch_size=16, max_steps=32)
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 32 and np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.5, losses  # nats


@pytest.mark.parametrize("label_smoothing", [0.0, 0.1])
def test_one_batch_of_four_equals_two_accumulated_batches_of_two(tmp_path, tokenizer, pairs, label_smoothing):
    """The two short targets form one micro-batch and the two long ones the other: averaging per micro-batch would
    weight their tokens unequally, dividing by the step's `num_items_in_batch` does not."""
    four = sorted(pairs, key=lambda pair: len(pair[1]))[:2] + sorted(pairs, key=lambda pair: len(pair[1]))[-2:]
    results = []
    for batch_size, accumulation in ((4, 1), (2, 2)):
        trainer = trainer_for(tmp_path / f"{batch_size}", tokenizer, four, in_order=True,
                              per_device_train_batch_size=batch_size,
                              gradient_accumulation_steps=accumulation, max_steps=1,
                              label_smoothing_factor=label_smoothing)
        trainer.train()
        results.append({k: v.detach().clone() for k, v in trainer.model.state_dict().items()})
    start = tiny_model(seed=5, vocab_size=len(tokenizer)).state_dict()
    assert any(not torch.equal(results[0][k], start[k]) for k in start)  # the step moved the weights
    for key in results[0]:
        torch.testing.assert_close(results[1][key], results[0][key], atol=1e-5, rtol=0, msg=key)


def test_generation_max_length_and_num_beams_are_respected(tmp_path, tokenizer, pairs):
    model = tiny_model(seed=5, vocab_size=len(tokenizer))
    calls = []
    original = model.generate

    def recording_generate(*args, **kwargs):
        calls.append(kwargs)
        return original(*args, **kwargs)

    model.generate = recording_generate
    trainer = trainer_for(tmp_path, tokenizer, pairs[:8], model=model, eval_pairs=pairs[:6],
                          predict_with_generate=True, generation_max_length=5, generation_num_beams=3,
                          per_device_eval_batch_size=3)
    metrics = trainer.evaluate()
    assert calls and all(c["max_length"] == 5 and c["num_beams"] == 3 for c in calls), calls
    assert {"eval_bleu", "eval_chrf"} <= set(metrics)
    predictions = trainer.predict(tokenize(tokenizer, pairs[:6], 64)).predictions  # padded with -100 and PAD
    lengths = ((predictions != -100) & (predictions != tokenizer.pad_token_id)).sum(-1)
    assert lengths.max() == 5, lengths  # max_length 5, the decoder start token <s> included


def test_predict_with_generate_runs_the_papers_search_of_a_saved_models_generation_config(tmp_path, tokenizer, pairs):
    """A model whose generation config asks for the paper's decoding (every saved folder's; run_trainer.py's from its
    start) evaluates under Seq2SeqTrainer, which passes the labels and synced_gpus=False to generate(): its
    predictions are GNMT beam search's, called directly."""
    model = tiny_model(seed=5, vocab_size=len(tokenizer))
    set_paper_decoding(model.generation_config, num_beams=4, alpha=0.6)
    trainer = trainer_for(tmp_path, tokenizer, pairs[:8], model=model, predict_with_generate=True,
                          per_device_eval_batch_size=6)
    predictions = trainer.predict(tokenize(tokenizer, pairs[:6], 64)).predictions
    inputs = tokenizer([source for source, _ in pairs[:6]], padding=True, return_tensors="pt")
    expected = gnmt_beam_search(model, inputs["input_ids"], inputs["attention_mask"], num_beams=4, alpha=0.6)
    tokens = lambda rows: [[t for t in row.tolist() if t not in (-100, tokenizer.pad_token_id)] for row in rows]
    assert tokens(torch.as_tensor(predictions)) == tokens(expected)


def test_batch_by_batch_the_score_is_the_whole_sets(tmp_path, tokenizer, translation_folder, pairs):
    """The Trainer's `batch_eval_metrics` (evaluation in bounded memory) hands compute_metrics a batch at a time, as
    tensors, and `compute_result` at the last; `eval_do_concat_batches false`, a list of the batches. Either way the
    score is the whole set's, as by default (the Trainer refused the first at its start; the second stopped at the
    first evaluation), and with the first the next evaluation starts afresh."""
    model = VaswaniForConditionalGeneration.from_pretrained(translation_folder)
    scores = []
    for arguments in ({}, {"batch_eval_metrics": True}, {"eval_do_concat_batches": False}):
        trainer = trainer_for(tmp_path, tokenizer, pairs[:4], model=model, eval_pairs=pairs[:10],
                              predict_with_generate=True, per_device_eval_batch_size=4, **arguments)
        scores += [trainer.evaluate()["eval_bleu"] for _ in range(1 + bool(arguments))]
    assert 0 < scores[0] < 100 and scores == [scores[0]] * 5


def test_compute_metrics_reads_minus_100_as_padding(tokenizer):
    references = ["Der Hund sieht den Mann.", "Eine Frau liest."]
    ids = tokenizer(references, padding=True)["input_ids"]
    width = max(map(len, ids)) + 2
    padded = np.full((2, width), -100)
    for row, sequence in enumerate(ids):
        padded[row, : len(sequence)] = sequence
    metrics = make_compute_metrics(tokenizer, False)(EvalPrediction(predictions=padded, label_ids=padded.copy()))
    assert metrics["bleu"] == pytest.approx(100.0) and metrics["chrf"] == pytest.approx(100.0)
    worse = padded.copy()
    worse[0, 1] = tokenizer.convert_tokens_to_ids("<unk>")
    assert make_compute_metrics(tokenizer, False)(EvalPrediction(predictions=worse, label_ids=padded))["bleu"] < 100


def entry_flags(tmp_path) -> list[str]:
    """run_trainer.py's flags: 300 training pairs (6 to validate, 6 to test) in JSON-lines files, a tiny model."""
    data, flags = generate(), []
    for split, size in (("train", 300), ("validation", 6), ("test", 6)):
        file = tmp_path / f"{split}.jsonl"
        file.write_text("".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n"
                                for en, de in data[split][:size]), encoding="utf-8")
        flags += [f"--{split}_file", str(file)]
    return [*flags, "--vocab_size", "200", "--d_model", "32", "--d_ff", "64", "--num_heads", "4", "--num_layers", "2",
            "--warmup_steps", "2", "--per_device_train_batch_size", "16", "--generation_max_length", "20",
            "--disable_tqdm", "true"]


def test_the_trainer_entry_point_into_english_scores_table_2s_bleu_with_englishs_moses_tokens(tmp_path):
    """As run.py's (test_training_run.py): --target_lang names Table 2's BLEU's Moses tokenizer, here English's."""
    output = tmp_path / "out"
    flags = [*entry_flags(tmp_path), "--output_dir", str(output), "--max_steps", "1", "--eval_strategy", "no"]
    run_trainer.main([*flags, "--source_lang", "de", "--target_lang", "en"])
    signature = json.loads((output / "metrics.json").read_text(encoding="utf-8"))["test"]["bleu_tokenized_signature"]
    assert signature.startswith("moses:en|compounds:split|")


def test_the_trainer_entry_point_writes_a_hub_ready_folder_and_pushes_it_alone(tmp_path, monkeypatch, recwarn):
    """With --push_to_hub (huggingface_hub's calls recorded), the finished folder's model files go up once, at the
    end, as vaswani-push sends them: not the Trainer's own uploads at each save (logs, training_args.bin)."""
    import huggingface_hub

    from vaswani_hf.tools.hub import published_files

    calls = []
    monkeypatch.setenv("HF_TOKEN", "hf_vaswaniTestToken0123456789abcdef")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite's; the calls are recorded
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: calls.append(
        ("create", repo_id, kw["private"])) or huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}"))
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **kw: calls.append(
        ("upload", kw["repo_id"], sorted(kw.get("allow_patterns") or ["everything"]))))
    output = tmp_path / "out"
    flags = [*entry_flags(tmp_path), "--output_dir", str(output), "--max_steps", "6", "--eval_steps", "3",
             "--save_steps", "3"]
    run_trainer.main([*flags, "--label_smoothing_factor", "0.2", "--push_to_hub", "--hub_model_id", "org/tiny",
                      "--hub_private_repo", "true"])
    assert not [w for w in recwarn if "pin_memory" in str(w.message)]  # no pinned memory asked of a CPU
    assert calls == [("create", "org/tiny", True), ("upload", "org/tiny", sorted(published_files(output)))]
    with pytest.raises(SystemExit, match=f"error: --output_dir {output} is not empty"):  # its tokenizer is not reused
        run_trainer.main(flags)
    metrics = json.loads((output / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["train_steps"] == 6 and metrics["test"]["bleu_signature"].startswith("nrefs:1")
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "pipeline_vaswani.py"} <= {
        p.name for p in output.iterdir()}
    arguments = output / "checkpoint-3" / "training_args.json"  # not the Trainer's pickle of them (training_args.bin)
    assert json.loads(arguments.read_text(encoding="utf-8"))["seed"] == 42 and not list(output.rglob("*.bin"))
    for folder in (output, output / "checkpoint-3"):  # the Trainer's checkpoints decode as the finished model does
        generation = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
        assert (generation["num_beams"], generation["gnmt_alpha"], generation["extra_length"]) == (4, 0.6, 50)
        # and hold none of the defaults Seq2SeqTrainer's evaluation fills the model's generation config with
        assert not {"max_length", "min_length", "top_k", "temperature"} & set(generation), generation
    card = " ".join((output / "README.md").read_text(encoding="utf-8").split())  # the Trainer's recipe, not run.py's
    assert ("- recipe: batches counted in sentences, not tokens - recipe: the Trainer's label smoothing (ε/V on every "
            "token, not ε/(V-1) on the others) - recipe: no checkpoint averaging - recipe: `warmup_steps=2` (paper: "
            "4000) - recipe: `label_smoothing=0.2` (paper: 0.1)") in card  # the flags' changes too
    assert "Recipe (§5): joint BPE, batches of 16 sentences per process" in card
    assert "label smoothing ε_ls = 0.2;" in card and "`num_beams=" not in card  # the paper's decoding


def test_the_trainer_entry_point_without_predict_with_generate_validates_by_its_loss(tmp_path):
    """--predict_with_generate false: the Trainer's predictions are logits, not tokens, and BLEU read them as tokens:
    the run died at its first validation. It validates by its loss alone, as the Trainer does without metrics."""
    output = tmp_path / "out"
    run_trainer.main([*entry_flags(tmp_path), "--output_dir", str(output), "--max_steps", "2", "--eval_steps", "1",
                      "--save_steps", "2", "--predict_with_generate", "false"])
    logged = json.loads((output / "checkpoint-2" / "trainer_state.json").read_text(encoding="utf-8"))["log_history"]
    validations = [entry for entry in logged if "eval_loss" in entry]
    assert len(validations) == 2 and not any("eval_bleu" in entry for entry in validations)


@pytest.mark.parametrize("flags, launcher, trained_with, trained_in", [
    (["--bf16", "true"], "no", "eager", "bf16"), (["--bf16", "false"], "no", "sdpa", "no"),
    ([], "bf16", "eager", "bf16")])  # `accelerate launch --mixed_precision bf16`, which the Trainer takes
def test_the_trainer_entry_point_on_a_cpu_under_bf16_trains_with_eager_attention_and_saves_sdpa(
        tmp_path, monkeypatch, flags, launcher, trained_with, trained_in):
    """As run.py (training/step.py): under the Trainer's bfloat16 autocast on a CPU (--bf16, or the launcher's) the
    training steps attend by the eager attention, in float32 by SDPA; the test set is decoded, and the model saved,
    with SDPA either way; the card names the precision the run trained in."""
    from transformers import Trainer

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    called = attention_in_steps(monkeypatch, Trainer, "training_step")
    decoded = []
    monkeypatch.setattr(run_trainer, "translate", lambda model, *args, **kwargs: decoded.append(
        model.config._attn_implementation) or translate(model, *args, **kwargs))
    output = tmp_path / "out"
    run_trainer.main([*entry_flags(tmp_path), "--output_dir", str(output), "--max_steps", "2", "--eval_strategy", "no",
                      "--save_steps", "2", *flags])
    assert called == {trained_with} and decoded == ["sdpa"]
    assert VaswaniForConditionalGeneration.from_pretrained(output).config._attn_implementation == "sdpa"
    assert f'"mixed_precision": "{trained_in}"' in (output / "README.md").read_text(encoding="utf-8")


def test_the_trainer_entry_point_on_a_cpu_trains_on_the_cores_it_may_use(tmp_path, monkeypatch):
    """`accelerate launch` without GPUs sets OMP_NUM_THREADS=1 (one torch thread) in every process, a lone one too: a
    launched run trained 1.5x slower on two cores (benchmarks/README.md, session 117). As run.py, the run shares the
    cores it may use (three here) among its processes (one)."""
    from transformers import Trainer

    import training.distributed

    monkeypatch.setattr(training.distributed, "usable_cores", lambda: 3)
    threads, step, before = [], Trainer.training_step, torch.get_num_threads()
    monkeypatch.setattr(Trainer, "training_step", lambda self, *args: threads.append(torch.get_num_threads()) or step(
        self, *args))
    torch.set_num_threads(1)  # as the launcher's OMP_NUM_THREADS=1
    try:
        run_trainer.main([*entry_flags(tmp_path), "--output_dir", str(tmp_path / "out"), "--max_steps", "1",
                          "--eval_strategy", "no", "--use_cpu", "true"])
    finally:
        torch.set_num_threads(before)
    assert threads == [3]


def test_the_trainer_entry_points_defaults_are_the_papers_and_a_preset_sets_its_keys(capsys):
    """§5.3: Adam(0.9, 0.98, 1e-9) without weight decay or clipping, 4,000 warmup steps, then the inverse square
    root from the peak d_model^-0.5 · warmup^-0.5; §5.4: label smoothing 0.1; §6.1: beam 4. A preset's model, warmup,
    learning-rate scale and clipping keys set theirs (flags still win), and its decoding: §6.3's parser's beam, α
    and output limit; the run says which of its keys (run.py's alone: a time budget, token batches, averaging) it
    leaves out."""
    _, model_args, recipe, args = run_trainer.parse_arguments([])
    assert (args.adam_beta1, args.adam_beta2, args.adam_epsilon, args.weight_decay, args.max_grad_norm) == (
        0.9, 0.98, 1e-9, 0.0, 0.0)
    assert (args.warmup_steps, args.lr_scheduler_type, args.label_smoothing_factor, args.generation_num_beams) == (
        4000, "inverse_sqrt", 0.1, 4)
    assert (model_args.d_model, recipe.lr_scale, recipe.length_penalty_alpha, recipe.extra_length) == (
        512, 1.0, 0.6, 50)
    assert args.learning_rate == pytest.approx(512**-0.5 * 4000**-0.5)
    args = run_trainer.parse_arguments(["--d_model", "256", "--warmup_steps", "400", "--lr_scale", "2"])[3]
    assert args.learning_rate == pytest.approx(2 * 256**-0.5 * 400**-0.5)
    preset = read_preset("cpu-medium")
    _, model_args, recipe, args = run_trainer.parse_arguments(["--preset", "cpu-medium"])
    assert (model_args.d_model, args.warmup_steps, recipe.lr_scale, args.max_grad_norm) == (
        preset["d_model"], preset["warmup_steps"], preset["lr_scale"], preset["max_grad_norm"])
    assert args.learning_rate == pytest.approx(preset["lr_scale"] * preset["d_model"]**-0.5
                                               * preset["warmup_steps"]**-0.5)
    assert capsys.readouterr().out.strip() == (
        "note: --preset cpu-medium: average_checkpoints, average_share, cooldown_share, dropout_epochs, "
        "eval_max_sentences, evaluations, max_tokens, max_train_minutes, tokens_per_step, warmup_share: "
        "training/run.py's recipe, not the Trainer's; this run leaves them out")
    assert run_trainer.parse_arguments(["--preset", "cpu-medium", "--warmup_steps", "7"])[3].warmup_steps == 7
    _, model_args, recipe, args = run_trainer.parse_arguments(["--preset", "parsing"])
    assert (model_args.num_layers, args.generation_num_beams, recipe.length_penalty_alpha, recipe.extra_length,
            recipe.evalb) == (4, 21, 0.3, 300, True)
    _, model_args, recipe, args = run_trainer.parse_arguments(["--preset", "base"])
    assert (model_args.vocab_size, args.max_steps, args.eval_steps) == (37000, 100000, 5000)


def test_the_trainer_entry_points_card_names_each_recipe_value_changed_from_the_papers():
    """The card's recipe line names the paper's optimizer and schedule (§5.3): each Trainer flag that changes them is a
    deviation on the card, as are warmup, label smoothing and the peak learning rate, the scale or the value given.
    Without label smoothing, the Trainer's way of smoothing is not one."""
    fixed = ["recipe: batches counted in sentences, not tokens",
             "recipe: the Trainer's label smoothing (ε/V on every token, not ε/(V-1) on the others)",
             "recipe: no checkpoint averaging"]

    def deviations(*flags):
        _, model_args, recipe, args = run_trainer.parse_arguments(["--output_dir", "unused", *flags])
        return run_trainer.card_deviations(args, recipe, model_args.d_model, 4, 0.6)

    assert deviations() == fixed
    assert deviations("--warmup_steps", "8000", "--label_smoothing_factor", "0.2", "--lr_scale", "2", "--optim", "sgd",
                      "--adam_beta2", "0.999", "--weight_decay", "0.01", "--lr_scheduler_type", "cosine",
                      "--max_grad_norm", "1") == fixed + [
        "recipe: `warmup_steps=8000` (paper: 4000)", "recipe: `label_smoothing=0.2` (paper: 0.1)",
        "recipe: `lr_scale=2.0` (paper: 1.0)", "recipe: `optim=sgd` (paper: Adam)",
        "recipe: `adam_beta2=0.999` (paper: 0.98)", "recipe: `weight_decay=0.01` (paper: 0.0)",
        "recipe: `lr_scheduler_type=cosine` (paper: inverse_sqrt)",
        "recipe: gradients clipped to a global L2 norm of 1 (paper: no clipping)"]
    assert deviations("--learning_rate", "1e-4", "--lr_scale", "2", "--optim", "adamw_torch") == fixed + [
        "recipe: `learning_rate=0.0001` (paper, §5.3: d_model^-0.5 · warmup_steps^-0.5)"]
    assert deviations("--label_smoothing_factor", "0") == [
        fixed[0], fixed[2], "recipe: `label_smoothing=0.0` (paper: 0.1)"]


def test_the_trainer_entry_points_card_states_the_batches_a_step_accumulates(tmp_path):
    """--gradient_accumulation_steps 3: an optimizer step takes three batches a process, as the card's recipe says."""
    flags = entry_flags(tmp_path)
    at = flags.index("--validation_file")
    output = tmp_path / "out"
    run_trainer.main([*flags[:at], *flags[at + 4:], "--output_dir", str(output), "--max_steps", "1",
                      "--gradient_accumulation_steps", "3"])
    card = " ".join((output / "README.md").read_text(encoding="utf-8").split())
    assert "Recipe (§5): joint BPE, batches of 16 sentences per process, 3 a step, Adam" in card
    assert '"gradient_accumulation_steps": 3' in card


def test_pairs_become_sources_and_labels_cut_to_max_source_length_with_their_end(tokenizer, pairs):
    """The dataset the Trainer reads: each pair's source tokenized as input, its target as labels, each cut to the
    first max_source_length - 1 tokens and </s> when longer."""
    dataset = tokenize(tokenizer, pairs, 12)
    lengths = []
    for row, (source, target) in zip(dataset, pairs, strict=True):
        for ids, text in ((row["input_ids"], source), (row["labels"], target)):
            whole = tokenizer(text)["input_ids"]
            lengths.append(len(whole))
            assert ids == (whole if len(whole) <= 12 else [*whole[:11], tokenizer.eos_token_id])
    assert min(lengths) < 12 < max(lengths)


def test_launched_as_two_cpu_processes_the_trainer_entry_point_shares_the_epoch_between_them(tmp_path):
    """`accelerate launch --multi_gpu --num_processes 2` on a machine without GPUs: one training process per rank,
    each taking half of every step's batches (DDP over gloo), not two copies of the whole run in one folder (the
    Trainer alone asks Accelerate for no CPU process group). One epoch of 300 pairs, 16 a process: 10 steps, not 19.
    Its checkpoints keep each process's generators, and both processes resumed from step 5 end as the run did."""
    ranks = accelerate_ranks(2, "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no", port=free_port())
    output = tmp_path / "out"
    result = run_forked([*entry_flags(tmp_path), "--output_dir", output, "--num_train_epochs", "1",
                         "--eval_steps", "10", "--save_steps", "5"], ranks, timeout=300, script=TRAINER)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads((output / "metrics.json").read_text(encoding="utf-8"))["train_steps"] == 10
    assert result.stdout.count("'eval_bleu'") == 1 and result.stdout.count("test: sacreBLEU") == 1  # rank 0 says
    saved = {p.name for p in (output / "checkpoint-5").iterdir()}  # each process's generators; no pickle
    assert {"optimizer.safetensors", "rng_state_0.safetensors", "rng_state_1.safetensors"} <= saved
    assert not {name for name in saved if name.endswith((".pt", ".pth", ".bin"))}
    copy = tmp_path / "resumed"  # resumed by both processes from step 5: the run never stopped
    shutil.copytree(output / "checkpoint-5", copy / "checkpoint-5")
    result = run_forked([*entry_flags(tmp_path), "--output_dir", copy, "--num_train_epochs", "1",
                         "--eval_strategy", "no", "--save_steps", "5", "--resume_from_checkpoint", "latest"],
                        ranks, timeout=300, script=TRAINER)
    assert result.returncode == 0, result.stderr[-3000:]
    whole, resumed = load_file(output / "model.safetensors"), load_file(copy / "model.safetensors")
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)


@pytest.mark.parametrize("launch", [{"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2"}, {}])
def test_a_request_to_shard_under_the_trainer_is_a_one_line_error(monkeypatch, launch):
    """Sharding is training/run.py's: under Accelerate's FSDP the Trainer would train unsharded (CPU) or fail as it
    wraps the model (GPU); asked by `accelerate launch --use_fsdp` or by the Trainer's own --fsdp."""
    for name, value in launch.items():
        monkeypatch.setenv(name, value)
    flags = [] if launch else ["--fsdp", "full_shard"]
    with pytest.raises(SystemExit, match="^error: training/run_trainer.py does not shard with FSDP: shard with "):
        run_trainer.parse_arguments(flags)


@pytest.mark.parametrize("launch", [True, False])
def test_deepspeed_under_the_trainer_entry_point_is_a_one_line_error(monkeypatch, launch):
    """DeepSpeed's engine would write its own checkpoints (pickles) where this run writes data: refused, asked by
    `accelerate launch --use_deepspeed` or by the Trainer's --deepspeed, before the Trainer looks for DeepSpeed (a
    traceback where it is not installed)."""
    if launch:
        monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    with pytest.raises(SystemExit, match="^error: training/run_trainer.py does not run DeepSpeed, whose checkpoints "):
        run_trainer.parse_arguments([] if launch else ["--deepspeed", "ds_config.json"])


def test_the_trainer_entry_point_resumes_the_newest_checkpoint_the_trainer_finished(tmp_path, monkeypatch):
    """`--resume_from_checkpoint latest`, as run.py takes it: the newest checkpoint-<step> holding trainer_state.json
    whole, the last file the Trainer writes (a run killed while saving leaves none, or part of one), and intact (a
    damaged file: a warning, and the one before). A folder with nothing to resume, a path that is no finished or no
    intact checkpoint, or another model than the checkpoint's, is one line before any work; a BPE that learned fewer
    tokens than --vocab_size asked (a small corpus) is the same model."""
    output, data = tmp_path / "out", entry_flags(tmp_path)
    flags = [*data, "--output_dir", str(output), "--max_steps", "15", "--save_steps", "5", "--eval_strategy", "no",
             "--generation_num_beams", "3", "--length_penalty_alpha", "1.3", "--extra_length", "2",
             "--vocab_size", "1000"]
    run_trainer.main(flags)
    assert AutoModelForSeq2SeqLM.from_pretrained(output).config.vocab_size < 1000  # all that 300 pairs hold
    state = output / "checkpoint-15" / "trainer_state.json"  # killed while writing its last checkpoint's last file
    state.write_text(state.read_text(encoding="utf-8")[:100], encoding="utf-8")
    with pytest.raises(SystemExit) as stop:  # another model than the checkpoint's: before any work, as run.py's
        run_trainer.main([*flags, "--d_model", "64", "--dropout", "0.3", "--resume_from_checkpoint", "latest"])
    assert stop.value.code == (f"error: {output / 'checkpoint-10'} holds another model: d_model 64 (the checkpoint's: "
                               "32), dropout 0.3 (the checkpoint's: 0.1)")
    loaded = []
    load = Seq2SeqTrainer._load_from_checkpoint
    monkeypatch.setattr(Seq2SeqTrainer, "_load_from_checkpoint",
                        lambda self, path, *args, **kwargs: loaded.append(path) or load(self, path, *args, **kwargs))
    beams = []  # the test set's decoding: its scores alone cannot tell beams from greedy in so short a run
    monkeypatch.setattr(run_trainer, "translate", lambda *args, **kwargs: beams.append(kwargs["num_beams"])
                        or translate(*args, **kwargs))
    run_trainer.main([*flags, "--resume_from_checkpoint", "latest"])
    assert loaded == [str(output / "checkpoint-10")]  # the newest by number, not by name (checkpoint-5)
    assert json.loads((output / "checkpoint-15" / "trainer_state.json").read_bytes())["global_step"] == 15
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(output), AutoTokenizer.from_pretrained(output)
    assert model.generation_config.num_beams == 3 and beams == [3]  # the run's beam, for its test set and folder
    assert (model.generation_config.gnmt_alpha, model.generation_config.extra_length) == (1.3, 2)  # and its search
    card = (output / "README.md").read_text(encoding="utf-8")  # each named beside the paper's
    assert ("- recipe: `num_beams=3` (paper: 4; its parser, §6.3: 21)\n- recipe: `length_penalty_alpha=1.3` (paper: "
            "0.6; its parser, §6.3: 0.3)\n- recipe: `extra_length=2` (paper: 50; its parser, §6.3: 300)\n") in card
    test = generate()["test"][:6]
    assert json.loads((output / "metrics.json").read_text(encoding="utf-8"))["test"] == score(
        translate(model, tokenizer, [s for s, _ in test], num_beams=3), [t for _, t in test], lang="de")
    adam = output / "checkpoint-5" / "optimizer.safetensors"  # damaged later: a full disk, a truncated copy
    adam.write_bytes(adam.read_bytes()[:1000])
    for given, message in (("latest", f"latest: {tmp_path / 'new'} holds no checkpoint the Trainer finished saving"),
                           (str(output), f"{output} is not a checkpoint the Trainer finished saving"),
                           (str(adam.parent), f"{adam.parent} cannot be resumed: {adam} is damaged: ")):
        with pytest.raises(SystemExit, match=f"^error: --resume_from_checkpoint {re.escape(message)}"):
            run_trainer.main([*data, "--output_dir", str(tmp_path / "new"), "--resume_from_checkpoint", given])
    assert not (tmp_path / "new").exists()
    (output / "checkpoint-15" / "scheduler.json").write_bytes(b"{")  # latest: the one before, with a warning
    shutil.copytree(output / "checkpoint-10", output / "checkpoint-20")  # killed before its trainer_state.json
    (output / "checkpoint-20" / "trainer_state.json").unlink()
    shutil.copytree(output / "checkpoint-10", output / "checkpoint-final")  # a copy of the user's: no step
    said = []
    assert trainer_checkpoints.resume_point("latest", output, said.append) == str(output / "checkpoint-10")
    damaged = output / "checkpoint-15" / "scheduler.json"
    why = f"{damaged} is damaged: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    assert said == [f"warning: checkpoint-15 cannot be resumed ({why}): trying the one before it"]


def test_a_full_disk_stops_the_trainer_entry_point_in_one_line_naming_its_intact_checkpoint(tmp_path, monkeypatch):
    """The disk full while the Trainer writes checkpoint 4 (which it writes in place), then the output folder: each
    time one line naming the newest intact checkpoint, what checkpoint 4 held of its files removed. Resumed once there
    is room, the run ends with the weights of the run never stopped."""
    from safetensors import SafetensorError

    from training import checkpoints as checkpoints_module

    flags = [*entry_flags(tmp_path), "--max_steps", "4", "--save_steps", "2", "--eval_strategy", "no"]
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "whole")])
    run, resume = tmp_path / "full", ["--output_dir", str(tmp_path / "full"), "--resume_from_checkpoint", "latest"]
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", run / "checkpoint-2")
    room = "checkpoint-2 is intact; make room, then add --resume_from_checkpoint latest"
    full = "Error while serializing: I/O error: No space left on device (os error 28)"  # (safetensors' words)
    save_file = checkpoints_module.save_file
    with monkeypatch.context() as patch:  # Adam's state, written after the weights
        patch.setattr(checkpoints_module, "save_file",
                      lambda *args, **kwargs: save_file(*args, **kwargs) or throw(SafetensorError(full)))
        with pytest.raises(SystemExit) as stop:
            run_trainer.main([*flags, *resume])
    assert stop.value.code == f"error: checkpoint-4 could not be written in {run} ({full}): {room}"
    assert sorted(path.name for path in run.iterdir() if "checkpoint" in path.name) == ["checkpoint-2"]
    with monkeypatch.context() as patch:
        patch.setattr(run_trainer, "write_output_folder",
                      lambda *args, **kwargs: throw(OSError(errno.EDQUOT, "Disk quota exceeded")))
        with pytest.raises(SystemExit) as stop:
            run_trainer.main([*flags, *resume])
    assert stop.value.code == (f"error: the model could not be written in {run} ([Errno 122] Disk quota exceeded): "
                               + room.replace("checkpoint-2", "checkpoint-4"))
    run_trainer.main([*flags, *resume])
    whole, resumed = load_file(tmp_path / "whole" / "model.safetensors"), load_file(run / "model.safetensors")
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)


def test_a_trainer_run_resumed_from_its_last_steps_checkpoint_trains_no_step_more(tmp_path):
    """Stopped after its last checkpoint (while testing, or writing its model), a run resumed ends as the run never
    stopped: the Trainer, which looks at max_steps only after a step, would take one more."""
    flags = [*entry_flags(tmp_path), "--max_steps", "2", "--save_steps", "2", "--eval_strategy", "no"]
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "whole")])
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "resumed"), "--resume_from_checkpoint", "latest"])
    assert sorted(path.name for path in (tmp_path / "resumed").glob("checkpoint-*")) == ["checkpoint-2"]
    assert json.loads((tmp_path / "resumed" / "metrics.json").read_text(encoding="utf-8"))["train_steps"] == 2
    whole, resumed = (load_file(tmp_path / run / "model.safetensors") for run in ("whole", "resumed"))
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)


def test_the_trainer_entry_points_checkpoints_hold_no_pickle_and_resume_the_run_exactly(tmp_path, monkeypatch):
    """A checkpoint holds data alone, as run.py's: Adam's state and the random generators as safetensors, the schedule
    and the arguments as JSON, not the Trainer's `torch.save` pickles. Resumed from its step-3 checkpoint (dropout on),
    a run ends with the weights of the run never stopped; so does one resumed from the plain Trainer's pickled
    checkpoint; and the embedding's tied copies, which no checkpoint holds, are not reported missing. A resumed run's
    minutes count its checkpoint's; resuming from an older checkpoint leaves the later ones aside."""
    flags = [*entry_flags(tmp_path), "--max_steps", "6", "--save_steps", "3", "--eval_strategy", "no"]
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "whole")])
    checkpoint = tmp_path / "whole" / "checkpoint-3"
    for file in checkpoint.iterdir():
        assert file.suffix in (".safetensors", ".json", ".py") and not zipfile.is_zipfile(file), file.name
    with monkeypatch.context() as patch:
        patch.setattr(run_trainer, "DataCheckpointTrainer", Seq2SeqTrainer)  # transformers' own, which pickles
        run_trainer.main([*flags, "--output_dir", str(tmp_path / "pickled"), "--max_steps", "3"])
    assert {"optimizer.pt", "scheduler.pt", "rng_state.pth"} <= {p.name for p in (tmp_path / "pickled").rglob("*")}
    warned = []
    monkeypatch.setattr(transformers.trainer.logger, "warning", warned.append)
    whole = load_file(tmp_path / "whole" / "model.safetensors")
    for start in (checkpoint, tmp_path / "pickled" / "checkpoint-3"):
        output = tmp_path / f"from-{start.parent.name}"
        shutil.copytree(start, output / "checkpoint-3")
        run_trainer.main([*flags, "--output_dir", str(output), "--resume_from_checkpoint", "latest"])
        resumed = load_file(output / "model.safetensors")
        assert all(torch.equal(resumed[name], whole[name]) for name in whole), start
    state = output.parent / "from-whole" / "checkpoint-3" / "trainer_state.json"  # as if its first 3 steps took 10 min
    kept = json.loads(state.read_text(encoding="utf-8"))
    kept["stateful_callbacks"]["TrainingClock"]["args"]["seconds"] = 600.0
    state.write_text(json.dumps(kept), encoding="utf-8")
    run_trainer.main([*flags, "--output_dir", str(output.parent / "from-whole"), "--resume_from_checkpoint",
                      str(state.parent)])
    minutes = json.loads((output.parent / "from-whole" / "metrics.json").read_text(encoding="utf-8"))["train_minutes"]
    assert 10 < minutes < 11  # the card's time: the run's, not its last session's
    assert not [text for text in warned if "missing keys" in text]
    # Resumed from its older checkpoint (and stopped at step 4): the later one is another timeline's, kept aside as
    # run.py keeps it, and no longer the run's latest.
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "whole"), "--resume_from_checkpoint", str(checkpoint),
                      "--max_steps", "4"])
    latest = Path(trainer_checkpoints.resume_point("latest", tmp_path / "whole"))
    assert json.loads((latest / "trainer_state.json").read_text(encoding="utf-8"))["global_step"] <= 4
    assert (tmp_path / "whole" / "abandoned-checkpoint-6" / "trainer_state.json").is_file()


def test_the_trainer_entry_points_clock_counts_training_not_its_set_up(monkeypatch):
    """The card's minutes run from the Trainer's start of training (the clock is made before the Trainer sets up and
    loads a checkpoint), on top of the seconds a resumed checkpoint kept."""
    now = [1000.0]
    monkeypatch.setattr(trainer_checkpoints.time, "time", lambda: now[0])
    clock = trainer_checkpoints.TrainingClock(seconds=600.0)
    now[0] += 30.0  # the Trainer's set-up
    clock.on_train_begin(None, None, None)
    now[0] += 45.0
    assert clock.elapsed() == 645.0 and clock.state() == {"args": {"seconds": 645.0}, "attributes": {}}


def test_a_resumed_trainer_run_goes_on_with_its_checkpoints_tokenizer(tmp_path):
    """Resumed from a checkpoint in another folder (a copy, another machine's) with other training data, the run
    goes on with the checkpoint's tokenizer, whose ids its weights learned: not a BPE learned anew from the data. Its
    output folder is the checkpoint's or an empty one."""
    flags = entry_flags(tmp_path)
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "first"), "--max_steps", "3", "--save_steps", "3",
                      "--eval_strategy", "no"])
    fewer = tmp_path / "fewer.jsonl"
    fewer.write_text("".join((tmp_path / "train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:60]),
                     encoding="utf-8")
    at = flags.index("--train_file") + 1
    run_trainer.main([*flags[:at], str(fewer), *flags[at + 1:], "--output_dir", str(tmp_path / "second"),
                      "--max_steps", "5", "--eval_strategy", "no", "--resume_from_checkpoint",
                      str(tmp_path / "first" / "checkpoint-3")])
    vocabularies = [AutoTokenizer.from_pretrained(tmp_path / run).get_vocab() for run in ("first", "second")]
    assert vocabularies[0] == vocabularies[1]
    with pytest.raises(SystemExit) as stop:  # into another run's folder: its files and this run's would mix
        run_trainer.main([*flags, "--output_dir", str(tmp_path / "second"), "--resume_from_checkpoint",
                          str(tmp_path / "first" / "checkpoint-3")])
    assert stop.value.code == (f"error: --output_dir {tmp_path / 'second'} is not empty, and not the folder of "
                               f"{tmp_path / 'first' / 'checkpoint-3'}: resume into that folder or an empty one")


def test_each_entry_point_names_the_others_checkpoint_in_one_line_before_any_work(tmp_path):
    """run.py's and the Trainer's checkpoints keep different states under one name, trainer_state.json: resumed by
    the other entry point, each is named with the one that resumes it, not a traceback of the Trainer's or run.py's
    "damaged"."""
    flags = entry_flags(tmp_path)
    trainer_run, run_py_run = tmp_path / "trainer", tmp_path / "run"
    run_trainer.main([*flags, "--output_dir", str(trainer_run), "--max_steps", "2", "--save_steps", "2",
                      "--eval_strategy", "no"])
    with accelerate_as_in_a_new_process():
        accelerator = Accelerator(cpu=True)
        model = tiny_model()
        save_checkpoint(accelerator, model, torch.optim.Adam(model.parameters()), run_py_run, 2, {}, keep=1)
    for given in ("latest", str(trainer_run / "checkpoint-2")):
        with pytest.raises(SystemExit) as stop:
            run_training(*flags[:6], "--output_dir", trainer_run, "--resume_from_checkpoint", given)
        assert stop.value.code == (f"error: --resume_from_checkpoint {given}: {trainer_run / 'checkpoint-2'} is "
                                   "training/run_trainer.py's: resume it with training/run_trainer.py")
    for given in ("latest", str(run_py_run / "checkpoint-2")):
        with pytest.raises(SystemExit) as stop:
            run_trainer.main([*flags, "--output_dir", str(run_py_run), "--resume_from_checkpoint", given])
        assert stop.value.code == (f"error: --resume_from_checkpoint {given}: {run_py_run / 'checkpoint-2'} is "
                                   "training/run.py's: resume it with training/run.py")
    assert sorted(p.name for p in run_py_run.iterdir()) == ["checkpoint-2"]  # nothing done there


def test_the_trainer_entry_points_checkpoints_keep_the_fp16_loss_scale_as_json(tmp_path):
    """fp16 training (a GPU's) scales its loss by a factor that grows and backs off as the run goes: a checkpoint keeps
    the scaler's state as JSON, and resuming restores it (a CPU GradScaler stands in for the GPU's)."""
    arguments = Seq2SeqTrainingArguments(str(tmp_path), use_cpu=True, report_to="none")
    trainer = trainer_checkpoints.DataCheckpointTrainer(model=tiny_model(seed=5), args=arguments)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=7)
    scaler.scale(torch.ones(1))
    scaler.update(new_scale=96.0)
    trainer.accelerator.scaler = scaler
    trainer._save_scaler(str(tmp_path))
    trainer.accelerator.scaler = torch.amp.GradScaler("cpu")
    trainer._load_scaler(str(tmp_path))
    assert json.loads((tmp_path / "scaler.json").read_text(encoding="utf-8"))["scale"] == 96.0
    assert trainer.accelerator.scaler.state_dict() == scaler.state_dict()


def test_the_trainer_entry_points_seed_draws_the_new_models_weights(tmp_path, monkeypatch):
    """A new model's initial weights are drawn with --seed, as run.py's: the same seed gives the same start whatever
    the process drew before (torch's generator set otherwise first), another seed another start."""
    starts, embedding = [], "model.encoder.embed_tokens.weight"  # shared with the decoder's and the output's

    class Recorded(trainer_checkpoints.DataCheckpointTrainer):
        def __init__(self, model, **kwargs):
            starts.append({name: value.clone() for name, value in model.state_dict().items()})
            super().__init__(model=model, **kwargs)

    monkeypatch.setattr(run_trainer, "DataCheckpointTrainer", Recorded)
    flags = entry_flags(tmp_path)
    at = flags.index("--validation_file")
    for drawn_before, seed in ((0, "42"), (1, "42"), (0, "7")):
        torch.manual_seed(drawn_before)
        run_trainer.main([*flags[:at], *flags[at + 4:], "--output_dir", str(tmp_path / f"out{len(starts)}"),
                          "--max_steps", "1", "--seed", seed])
    assert starts[0].keys() == starts[1].keys() == starts[2].keys()
    assert all(torch.equal(starts[0][name], starts[1][name]) for name in starts[0])
    assert not torch.equal(starts[0][embedding], starts[2][embedding])


def test_the_trainer_entry_point_learns_its_bpe_from_bpe_sample_pairs(tmp_path):
    """--bpe_sample N, as in run.py: the joint BPE learns from N pairs drawn at random with --seed. From one pair (two
    sentences) the merges run out far below --vocab_size 200, which all 300 pairs reach. The runs have no validation
    set: they train without evaluating."""
    flags = entry_flags(tmp_path)
    at = flags.index("--validation_file")
    vocabularies = {}
    for sample in ([], ["--bpe_sample", "1"], ["--bpe_sample", "1", "--seed", "7"]):
        output = tmp_path / f"out{len(sample)}"
        run_trainer.main([*flags[:at], *flags[at + 2:], "--output_dir", str(output), "--max_steps", "1", *sample])
        vocabularies[len(sample)] = AutoTokenizer.from_pretrained(output).get_vocab()
    assert len(vocabularies[0]) == 200 and len(vocabularies[2]) < 100
    assert vocabularies[4] != vocabularies[2]  # another seed, another pair


def fine_tuning_flags(tmp_path, start) -> list[str]:
    """entry_flags' data without its model flags, to fine-tune `start`."""
    flags = entry_flags(tmp_path)
    data = flags[:flags.index("--vocab_size")]
    return [*data, "--model_name_or_path", str(start), "--per_device_train_batch_size", "16", "--disable_tqdm", "true",
            "--generation_max_length", "20"]


def test_the_trainer_entry_point_fine_tunes_a_saved_model_from_its_weights_with_its_tokenizer(tmp_path,
                                                                                             translation_folder):
    """--model_name_or_path: the folder's weights are where training starts (two Adam steps of 1e-9 leave every
    weight within 1e-6 of them, where a new model's would be far), its architecture and tokenizer are kept (its
    dropout the flag's), and the card names the folder it started from (no path, no Hub id in the metadata) and no
    other model's flags. Resumed, it is the start's model with the run's dropout (another dropout is one line). With
    no dropout given, the start's are kept."""
    from safetensors.torch import load_file

    output = tmp_path / "tuned"
    flags = [*fine_tuning_flags(tmp_path, translation_folder), "--output_dir", str(output), "--max_steps", "2",
             "--learning_rate", "1e-9", "--eval_strategy", "no", "--dropout", "0.25", "--save_steps", "1"]
    run_trainer.main(flags)
    start, tuned = (load_file(folder / "model.safetensors") for folder in (translation_folder, output))
    assert start.keys() == tuned.keys()
    for name in start:
        torch.testing.assert_close(tuned[name], start[name], atol=1e-6, rtol=0)
    sizes = ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "num_decoder_layers")
    first, last = ({size: json.loads((folder / "config.json").read_text(encoding="utf-8"))[size] for size in sizes}
                   for folder in (translation_folder, output))
    assert first == last
    config = json.loads((output / "config.json").read_bytes())
    assert config["dropout"] == 0.25  # the recipe's (§5.4), over the start's
    assert AutoTokenizer.from_pretrained(output).get_vocab() == AutoTokenizer.from_pretrained(
        translation_folder).get_vocab()
    generation = json.loads((output / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["gnmt_alpha"] == 0.6 and "dropout" not in generation  # the paper's decoding kept, nothing else
    card = (output / "README.md").read_text(encoding="utf-8")
    assert "`generate()` decodes as `generation_config.json` asks, the paper's way (§6.1)" in " ".join(card.split())
    assert (f"- recipe: fine-tuned from the local model folder {translation_folder.name}, its weights and tokenizer, "
            "not from the paper's initialization") in card
    assert "base_model" not in card and str(translation_folder.parent) not in card and '"d_model"' not in card
    assert "Recipe (§5): the tokenizer of the model it was fine-tuned from, batches of 16 sentences" in card
    with pytest.raises(SystemExit) as stop:  # resumed: the start's model, with the run's dropout
        run_trainer.main([*flags, "--dropout", "0.3", "--resume_from_checkpoint", "latest"])
    assert stop.value.code == (f"error: {output / 'checkpoint-2'} holds another model: dropout 0.3 (the "
                               "checkpoint's: 0.25)")
    run_trainer.main([*flags, "--resume_from_checkpoint", str(output / "checkpoint-1")])
    start = tmp_path / "start"  # dropouts of its own, none given: the start's kept
    shutil.copytree(translation_folder, start)
    config = json.loads((start / "config.json").read_text(encoding="utf-8"))
    (start / "config.json").write_text(json.dumps({**config, "dropout": 0.2, "attention_dropout": 0.05}),
                                       encoding="utf-8")
    run_trainer.main([*fine_tuning_flags(tmp_path, start), "--output_dir", str(tmp_path / "kept"), "--max_steps", "1",
                      "--eval_strategy", "no", "--save_strategy", "no"])
    kept = json.loads((tmp_path / "kept" / "config.json").read_text(encoding="utf-8"))
    assert (kept["dropout"], kept["attention_dropout"]) == (0.2, 0.05)


@pytest.mark.parametrize(("start", "flags", "named"), [
    ("trained", ["--d_model", "64"], "error: --d_model is a new model's: with --model_name_or_path, the config and"),
    ("trained", ["--preset", "cpu-small"], "error: --preset is a new model's: with --model_name_or_path, the config"),
    ("trained", ["--bpe_sample", "10"], "error: --bpe_sample is a new model's: with --model_name_or_path, the"),
    ("marian", [], "holds a 'marian' model, not a vaswani_hf one"),
])
def test_fine_tuning_refuses_a_new_models_flags_and_another_kind_of_model_in_one_line(tmp_path, translation_folder,
                                                                                      start, flags, named):
    """Before any work: a new model's flags (a preset's too); a model of another kind."""
    folder = translation_folder
    if start == "marian":
        save_marian_folder(folder := tmp_path / "marian")
    with pytest.raises(SystemExit) as stop:
        run_trainer.parse_arguments([*fine_tuning_flags(tmp_path, folder), "--output_dir", "unused", *flags])
    message = str(stop.value.code)
    assert message.startswith("error: ") and named in message and "\n" not in message


def test_a_resumed_trainer_run_checks_the_heads_widths_as_its_flags_give_them(tmp_path):
    """A checkpoint's config.json holds d_k and d_v whether or not the flags named them: heads of d_model / h are
    what flags without --d_k and --d_v build; narrower ones (Table 3 row B) are another model without them."""
    from training.arguments import ModelArguments

    sizes = {"vocab_size": 100, "d_model": 32, "d_ff": 64, "num_heads": 4, "num_layers": 1}
    for d_k, flags, refused in ((None, {}, None), (4, {}, "d_k None (the checkpoint's: 4)"), (4, {"d_k": 4}, None),
                                (None, {"d_v": 4}, "d_v 4 (the checkpoint's: 8)")):
        ModelArguments(**sizes, d_k=d_k).planned_config().save_pretrained(tmp_path)
        resumed = ModelArguments(**sizes, **flags)
        if refused is None:
            trainer_checkpoints.check_resumed_model(str(tmp_path), None, resumed)
        else:
            with pytest.raises(SystemExit, match=re.escape(f"holds another model: {refused}")):
                trainer_checkpoints.check_resumed_model(str(tmp_path), None, resumed)


@pytest.mark.parametrize("optim", ["adafactor", "sgd"])
def test_a_trainer_run_with_another_optimizer_checkpoints_and_resumes_exactly(tmp_path, optim):
    """`--optim` takes the Trainer's other optimizers, whose state is not Adam's: Adafactor keeps its step as a Python
    number, plain SGD keeps none, neither has Adam's betas. Each writes its checkpoints, and a run resumed from its
    step-2 checkpoint ends with the weights of the run never stopped."""
    flags = [*entry_flags(tmp_path), "--max_steps", "4", "--save_steps", "2", "--eval_strategy", "no",
             "--optim", optim]
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "whole")])
    shutil.copytree(tmp_path / "whole" / "checkpoint-2", tmp_path / "resumed" / "checkpoint-2")
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "resumed"), "--resume_from_checkpoint", "latest"])
    whole, resumed = (load_file(tmp_path / run / "model.safetensors") for run in ("whole", "resumed"))
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)


def test_a_checkpoint_of_the_model_alone_is_refused_for_resuming_in_one_line(tmp_path):
    """`--save_only_model` checkpoints hold no optimizer state, schedule or random state (transformers: they cannot
    resume). Resumed, the run went on with Adam's moments at zero and the warm-up from its first step, without a word;
    now one line, before any work, naming the fine-tuning that such a checkpoint can start."""
    output = tmp_path / "out"
    flags = [*entry_flags(tmp_path), "--output_dir", str(output), "--max_steps", "2", "--save_steps", "2",
             "--eval_strategy", "no", "--save_only_model", "true"]
    run_trainer.main(flags)
    checkpoint = output / "checkpoint-2"
    (output / "model.safetensors").unlink()
    for given in ("latest", str(checkpoint)):
        with pytest.raises(SystemExit) as stop:
            run_trainer.main([*flags, "--max_steps", "4", "--resume_from_checkpoint", given])
        assert stop.value.code == (f"error: --resume_from_checkpoint {given}: {checkpoint} holds no optimizer state "
                                   "and schedule to go on with (--save_only_model writes the model alone): fine-tune "
                                   f"from it, --model_name_or_path {checkpoint}")
    assert sorted(path.name for path in output.glob("checkpoint-*")) == ["checkpoint-2"]
    assert not (output / "model.safetensors").exists()


def test_a_trainer_run_whose_weights_are_not_finite_stops_in_one_line_before_its_checkpoint(tmp_path):
    """At --lr_scale 100000 the weights are NaN within a few steps. The Trainer's logged loss leaves a NaN out, and
    the run went on to its end: its checkpoint and model of NaNs, a test BLEU of 0, exit 0. Now it stops in one line
    at the first step it logs, evaluates or saves after (here checkpoint 4's): no checkpoint, no model."""
    output = tmp_path / "out"
    flags = [*entry_flags(tmp_path), "--output_dir", str(output), "--max_steps", "8", "--save_steps", "4",
             "--logging_steps", "100", "--eval_strategy", "no", "--lr_scale", "100000"]
    with pytest.raises(SystemExit) as stop:
        run_trainer.main(flags)
    assert stop.value.code == ("error: the weights are not finite after step 4: the run has diverged (a lower "
                               "--lr_scale or --learning_rate may keep them finite)")
    assert not list(output.glob("checkpoint-*")) and not (output / "model.safetensors").exists()


def test_a_sigterm_under_jit_checkpointing_saves_its_steps_checkpoint_and_the_resumed_run_ends_as_the_whole(
        tmp_path, monkeypatch, capsys):
    """`--enable_jit_checkpoint` (the Trainer's flag, for preemptible machines): a SIGTERM inside step 3 (dropout on)
    ends the run after that step with its checkpoint, one line and SIGTERM's status, neither tested nor written as if
    done. Resumed, it ends with the weights of the run never stopped. (transformers' own callback saved before the
    step's update, with the random generators past its dropout, as checkpoint 2: step 3 was made again otherwise.)"""
    flags = [*entry_flags(tmp_path), "--max_steps", "6", "--save_steps", "100", "--eval_strategy", "no",
             "--enable_jit_checkpoint", "true"]
    run_trainer.main([*flags, "--output_dir", str(tmp_path / "whole")])

    def terminated_in_step_3(self, args, state, control, **kwargs):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    output = tmp_path / "out"
    monkeypatch.setattr(trainer_checkpoints.TrainingClock, "on_step_begin", terminated_in_step_3, raising=False)
    with pytest.raises(SystemExit) as stop:
        run_trainer.main([*flags, "--output_dir", str(output)])
    assert stop.value.code == 128 + signal.SIGTERM
    assert capsys.readouterr().err.endswith("stopped at step 3 (SIGTERM), its checkpoint written: the same command "
                                            "with --resume_from_checkpoint latest goes on\n")
    assert sorted(path.name for path in output.glob("checkpoint-*")) == ["checkpoint-3"]
    assert not (output / "model.safetensors").exists() and not (output / "README.md").exists()
    monkeypatch.undo()
    run_trainer.main([*flags, "--output_dir", str(output), "--resume_from_checkpoint", "latest"])
    whole, resumed = (load_file(folder / "model.safetensors") for folder in (tmp_path / "whole", output))
    assert all(torch.equal(resumed[name], whole[name]) for name in whole)
