"""training/run.py end to end, as `accelerate launch` runs it: data parallelism, exact resumption after a kill,
atomic checkpoints, the Hub-ready output folder."""

import contextlib
import errno
import importlib.util
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
from accelerate.commands.config.config_args import ClusterConfig
from accelerate.utils import DistributedType
from forked import accelerate_ranks, free_port, run_forked, torch_ranks
from huggingface_hub import ModelCard
from safetensors.torch import load_file
from support import (
    CODE_FILES,
    accelerate_as_in_a_new_process,
    attention_in_steps,
    run_hidden,
    run_training,
    throw,
    tiny_model,
)
from torch._inductor import config as inductor_config
from transformers import AutoTokenizer, GenerationConfig

from training import treebank
from training.batching import encode, token_batches
from training.checkpoints import checkpoints, preempted
from training.default_data import generate
from training.evaluation import evaluate_model
from training.hub import set_run_decoding
from training.step import TrainingStep
from training.tokenizer import train_joint_bpe
from vaswani_hf import VaswaniForConditionalGeneration
from vaswani_hf.tools.hub import published_files

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.long  # scheduled first (conftest.py)
TINY = ["--d_model", "32", "--d_ff", "64", "--num_heads", "4", "--num_layers", "2", "--vocab_size", "300",
        "--max_tokens", "400", "--tokens_per_step", "800", "--warmup_steps", "4", "--eval_steps", "0",
        "--logging_steps", "1", "--seed", "3"]


@pytest.fixture(scope="module")
def small_data(tmp_path_factory):
    """2,000 training pairs and a few for validation and test, from the embedded grammar."""
    folder = tmp_path_factory.mktemp("data")
    splits = generate()
    files = {}
    for split, size in (("train", 2000), ("validation", 8), ("test", 8)):
        files[split] = folder / f"{split}.jsonl"
        with open(files[split], "w", encoding="utf-8") as f:
            f.writelines(json.dumps({"translation": {"en": en, "de": de}}) + "\n" for en, de in splits[split][:size])
    return ["--train_file", str(files["train"]), "--validation_file", str(files["validation"]),
            "--test_file", str(files["test"])]


def launch(output_dir, *flags, processes=1, env_extra=None, status=0, fsdp=False):
    """training/run.py in processes of its own, forked from one that has imported it (forked.py): one process, or the
    `processes` ranks of `accelerate launch --multi_gpu` (with `fsdp`: `--use_fsdp --fsdp_version 2`), CPU processes
    over gloo on a machine without GPUs (training/distributed.py). The launcher itself runs in test_readme.py.
    `env_extra`: variables for every process, or a list of each rank's; `status`: the exit status expected (a
    negative one: killed by that signal)."""
    ranks = [{}] if processes == 1 else accelerate_ranks(
        processes, "--mixed_precision", "no", "--dynamo_backend", "no",
        *(("--use_fsdp", "--fsdp_version", "2") if fsdp else ("--multi_gpu",)), port=free_port())
    # A guard against a hang, not a speed limit: the embedded-data run takes about 135 s on one core of a 2-core
    # AMD EPYC (family 23) beside the other worker's tests, and a slower machine must not fail it by the clock.
    extras = env_extra if isinstance(env_extra, list) else [env_extra or {}] * len(ranks)
    result = run_forked(["--output_dir", output_dir, *flags], [{**rank, **extra} for rank, extra in zip(
        ranks, extras, strict=True)], timeout=900)
    assert result.returncode == status, result.stdout[-3000:] + result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def treebank_data(tmp_path_factory):
    """A toy treebank of 2,000 training trees and 8 each for validation and test, in the treebank's brackets, made
    into pairs of sentences and linearized trees by training/treebank.py."""
    folder, draw = tmp_path_factory.mktemp("treebank"), random.Random(0)

    def noun_phrase(depth: int = 0) -> str:
        words = [f"(DT {draw.choice(['the', 'a'])})", *["(JJ big)"] * (draw.random() < 0.3),
                 f"(NN {draw.choice(['dog', 'cat', 'house', 'garden'])})"]
        simple = f"(NP {' '.join(words)})"
        if depth or draw.random() < 0.6:
            return simple
        return f"(NP {simple} (PP (IN {draw.choice(['in', 'near'])}) {noun_phrase(1)}))"

    def sentence() -> str:
        verb = draw.choice(["(VP (VBZ sleeps))", f"(VP (VBZ sees) {noun_phrase()})"])
        return f"( (S {noun_phrase().replace('(NP', '(NP-SBJ', 1)} {verb} (. .)) )"

    flags = ["--source_lang", "en", "--target_lang", "tree"]
    for split, size in (("train", 2000), ("validation", 8), ("test", 8)):
        (folder / f"{split}.mrg").write_text("\n".join(sentence() for _ in range(size)), encoding="utf-8")
        with open(folder / f"{split}.jsonl", "w", encoding="utf-8") as out, contextlib.redirect_stdout(out):
            treebank.main([str(folder / f"{split}.mrg")])
        flags += [f"--{split}_file", str(folder / f"{split}.jsonl")]
    return flags


def train_here(output_dir, *flags) -> None:
    """training/run.py in this process (support.run_training)."""
    run_training("--output_dir", output_dir, *flags)


# The runs that several tests compare with, made once (per pytest-xdist worker: each group stays on one worker).
ONE_PROCESS = [*TINY, "--dropout", "0", "--max_steps", "4", "--average_checkpoints", "2", "--save_steps", "2",
               "--lr_scale", "0.01", "--eval_steps", "2", "--eval_max_sentences", "4", "--max_grad_norm", "1.0"]
WHOLE = [*TINY, "--dropout", "0.1", "--max_steps", "8", "--save_steps", "2", "--average_checkpoints", "2"]


@pytest.fixture(scope="module")
def one_process_run(tmp_path_factory, small_data):
    """1 process with the global batch of the 2-process runs. Dropout 0: processes draw different dropout masks;
    lr_scale 0.01: a realistic peak of about 9e-4. Validation and beam search inside the run (step 2) and at its end.
    Gradients clipped to norm 1.0, below their norm at every step: the processes must clip by the global norm."""
    run = tmp_path_factory.mktemp("one") / "run"
    with (run.parent / "stderr.txt").open("w", encoding="utf-8") as log, contextlib.redirect_stderr(log):  # a log file
        train_here(run, *ONE_PROCESS, *small_data)
    return run


@pytest.fixture(scope="module")
def fsdp_run(tmp_path_factory, small_data):
    """ONE_PROCESS's run on 2 processes sharded by FSDP2 (`accelerate launch --use_fsdp --fsdp_version 2`); the
    folder and what the run printed."""
    run = tmp_path_factory.mktemp("fsdp") / "run"
    result = launch(run, *ONE_PROCESS, *small_data, processes=2, fsdp=True)
    return run, result.stdout + result.stderr


@pytest.fixture(scope="module")
def whole_run(tmp_path_factory, small_data):
    """An uninterrupted run with dropout, a checkpoint every 2 steps and the last 2 averaged: what the runs that are
    killed, validated or resumed must equal. Read only (a test that changes it works on a copy)."""
    run = tmp_path_factory.mktemp("whole") / "run"
    train_here(run, *WHOLE, *small_data)
    return run


def history(output_dir):
    return json.loads((Path(output_dir) / "metrics.json").read_text(encoding="utf-8"))["history"]


def left_after(run: Path, checkpoint: str, folder: Path) -> Path:
    """What a run stopped after `checkpoint` leaves to resume from: its tokenizer and that checkpoint, and none of
    the finished run's output (what a test reads after resuming is what the resumed run wrote)."""
    shutil.copytree(run / checkpoint, folder / checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(run / name, folder / name)
    return folder


def assert_same_weights(a, b, atol, skip=()):
    weights_a, weights_b = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    assert weights_a.keys() == weights_b.keys()
    for key in weights_a:
        if not key.endswith(skip):
            torch.testing.assert_close(weights_a[key], weights_b[key], atol=atol, rtol=0, msg=key)


@pytest.mark.long(minutes=1.7)
def test_the_embedded_default_run_learns(tmp_path):
    """The main job's recipe on the embedded data, cut to 200 steps, its last 5 checkpoints (the last tenth, as the
    preset's average_share asks) averaged, scored on the first 100 validation and test pairs: BLEU far above zero
    (test BLEU 93.5 on a Zen 2, AMD EPYC family 23; 93.8 on a Zen 3, family 25 model 1)."""
    default = ROOT / "training" / "data" / "default"
    for split in ("validation", "test"):
        first = (default / f"{split}.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)[:100]
        (tmp_path / f"{split}.jsonl").write_text("".join(first), encoding="utf-8")
    launch(tmp_path / "main", "--preset", "cpu-small", "--max_train_minutes", "60", "--max_steps", "200",
           "--eval_steps", "0", "--save_minutes", "0", "--save_steps", "4",  # checkpoints by steps: deterministic
           "--train_file", str(default / "train.jsonl"), "--validation_file", str(tmp_path / "validation.jsonl"),
           "--test_file", str(tmp_path / "test.jsonl"))  # the README's command, cut
    metrics = json.loads((tmp_path / "main" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["test"]["bleu"] > 80, metrics["test"]
    # The preset chooses GNMT α on the validation set (§6.1) and saves the winner with the model.
    search = {float(alpha): bleu for alpha, bleu in metrics["alpha_search"].items()}
    preset = json.loads((ROOT / "training" / "presets" / "cpu-small.json").read_text(encoding="utf-8"))
    assert sorted(search) == sorted(preset["alpha_candidates"])
    generation = json.loads((tmp_path / "main" / "generation_config.json").read_text(encoding="utf-8"))
    assert search[generation["gnmt_alpha"]] == max(search.values())
    # The preset fits its schedule to the budget: with 60 minutes and --max_steps 200 the run expects 200 steps, so its
    # warmup ends at warmup_share x 200 (training/budget.py), not at warmup_steps.
    rates = [h["learning_rate"] for h in metrics["history"]]
    assert rates.index(max(rates)) + 1 == round(preset["warmup_share"] * 200) != preset["warmup_steps"]
    assert metrics["averaged_checkpoints"] == [f"checkpoint-{step}" for step in range(184, 201, 4)]
    # Its validation perplexity (the averaged model's, training/evaluation.py's loss) is what `vaswani-translate
    # --score` finds over the same pairs, and the card gives it.
    from vaswani_hf.tools.loading import load
    from vaswani_hf.tools.translate import score

    pairs = [json.loads(line)["translation"] for line in (tmp_path / "validation.jsonl").read_bytes().splitlines()]
    found = score(*load(str(tmp_path / "main"), "cpu", fast=False), [pair["en"] for pair in pairs],
                  [pair["de"] for pair in pairs])
    perplexity = math.exp(-sum(pair.log_prob for pair in found) / sum(pair.tokens for pair in found))
    assert perplexity == pytest.approx(metrics["validation"]["perplexity"], rel=1e-4)
    assert (f"| validation | perplexity | {metrics['validation']['perplexity']:.2f} | per target token, EOS counted |"
            in (tmp_path / "main" / "README.md").read_text(encoding="utf-8"))


@pytest.mark.xdist_group("one_process_run")
def test_in_a_log_file_the_progress_bar_is_written_every_30_seconds_not_at_every_logged_step(one_process_run):
    """The run logs every step (--logging_steps 1). Written to a file, its bar is shown when it starts, every 30 s (or
    10 s after a line held back: tqdm's monitor) and when it ends, that last line with the last step's loss. A line
    each logged step would fill a cluster job's log, each with the rate tqdm measured at its last own line: after a
    compiled first step, hours left for a run of seconds."""
    lines = [line for line in re.split(r"[\r\n]", (one_process_run.parent / "stderr.txt").read_text(encoding="utf-8"))
             if line.startswith("training:")]
    metrics = json.loads((one_process_run / "metrics.json").read_bytes())
    assert 2 <= len(lines) <= 2 + metrics["train_minutes"] * 6
    assert " 4/4 " in lines[-1] and f"loss={metrics['history'][-1]['loss']:.3f}" in lines[-1]


@pytest.mark.xdist_group("one_process_run")
def test_two_processes_train_like_one_process_with_the_same_global_batch(tmp_path, small_data, one_process_run):
    """2 processes x 1 batch per step (DDP over gloo) == 1 process x 2 accumulated batches per step, with
    validation and beam search inside the run (step 2) and at its end."""
    launch(tmp_path / "two", *ONE_PROCESS, *small_data, processes=2)
    one, two = history(one_process_run), history(tmp_path / "two")
    assert [h["tokens"] for h in one] == [h["tokens"] for h in two]
    assert [h["loss"] for h in two] == pytest.approx([h["loss"] for h in one], rel=1e-5)
    assert all(h["grad_norm"] > 1.0 for h in one)  # clipping was at work
    assert [h["grad_norm"] for h in two] == pytest.approx([h["grad_norm"] for h in one], rel=1e-5)
    assert [h["validation_loss"] for h in two if "validation_loss" in h] == pytest.approx(
        [h["validation_loss"] for h in one if "validation_loss" in h], rel=1e-5)
    # The key biases get no gradient in exact arithmetic (softmax ignores the q.b_k added to every score), so
    # Adam (eps 1e-9) turns the rounding noise of their gradient into updates that differ with the summation
    # order. They do not change the model's function: its validation loss and its translations agree.
    assert_same_weights(one_process_run, tmp_path / "two", atol=1e-5, skip=("k_proj.bias",))
    metrics_one, metrics_two = (json.loads((d / "metrics.json").read_text(encoding="utf-8"))
                                for d in (one_process_run, tmp_path / "two"))
    assert metrics_two["validation"]["loss"] == pytest.approx(metrics_one["validation"]["loss"], rel=1e-5)
    assert metrics_two["test"]["bleu"] == metrics_one["test"]["bleu"]
    assert metrics_one["distributed"]["parallelism"] == "none"
    assert metrics_two["distributed"]["parallelism"] == "DDP" and metrics_two["distributed"]["backend"] == "gloo"


@pytest.mark.xdist_group("one_process_run")
def test_a_sigterm_to_one_process_stops_both_after_the_same_step_and_resumed_they_train_as_one_process(
        tmp_path, small_data, one_process_run):
    """Under --enable_jit_checkpoint the processes agree after each step whether any has had a SIGTERM: one sent to
    rank 1 alone, inside step 3, stops both after it, with one checkpoint and one line. Resumed, the two processes
    end as the one process that was never stopped."""
    run, flags = tmp_path / "two", [*ONE_PROCESS, *small_data, "--enable_jit_checkpoint"]
    stopped = launch(run, *flags, processes=2, env_extra=[{}, {"VASWANI_FAULT": "step-3:SIGTERM"}],
                     status=128 + signal.SIGTERM)
    assert stopped.stderr.count("stopped at step 3 (SIGTERM), its checkpoint written") == 1
    assert [(path.name, preempted(path)) for path in checkpoints(run)] == [
        ("checkpoint-2", False), ("checkpoint-3", True)]
    launch(run, *flags, "--resume_from_checkpoint", "latest", processes=2)
    assert [h["loss"] for h in history(run)] == pytest.approx([h["loss"] for h in history(one_process_run)],
                                                              rel=1e-5)
    assert_same_weights(one_process_run, run, atol=1e-5, skip=("k_proj.bias",))  # (the test above says why)


@pytest.mark.parametrize("launched, compiled", [("AOT_EAGER", 2), ("NO", 0)])
def test_accelerate_launchs_dynamo_backend_compiles_the_runs_own_step(tmp_path, small_data, monkeypatch, launched,
                                                                     compiled):
    """`accelerate launch --dynamo_backend X` (or `accelerate config`'s): Accelerate compiled the whole model itself,
    with torch.compile's defaults, in place of the run's step (cpu-small: 3 steps took 50 s, to other losses). The
    run tells Accelerate no, and compiles its own step with X, as `--compile X` does (the model's graph and the
    loss's); the launcher's default, no, leaves a CPU run eager."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", launched)
    models, step = [], TrainingStep.__call__
    monkeypatch.setattr(TrainingStep, "__call__", lambda self, *args: models.append(type(self.model).__name__) or step(
        self, *args))
    train_here(tmp_path / "out", *TINY, *small_data, "--max_steps", "2", "--no_fast_cpu")
    assert json.loads((tmp_path / "out" / "metrics.json").read_text(encoding="utf-8"))["compiled_graphs"] == compiled
    assert models == ["VaswaniForConditionalGeneration"] * 2


@pytest.mark.xdist_group("one_process_run")
def test_a_compiled_run_trains_as_the_eager_run_and_compiles_once(tmp_path, small_data, one_process_run):
    """--compile aot_eager: torch.compile's dynamo and AOTAutograd (inductor's front end, without its C++ compiler on a
    CPU) over the model and the loss (the plain formula, which the eager run computes block by block). Its losses and
    gradient norms are the eager run's, and its 8 batches of different shapes (2 a step) make one graph for the model
    and one for the loss: the sizes are symbolic from the first compile."""
    result = launch(tmp_path / "compiled", *ONE_PROCESS, *small_data, "--compile", "aot_eager", "--no_fast_cpu")
    eager, compiled = history(one_process_run), history(tmp_path / "compiled")
    assert len({h["tokens"] for h in eager}) > 1
    assert [h["loss"] for h in compiled] == pytest.approx([h["loss"] for h in eager], rel=1e-6)
    assert [h["grad_norm"] for h in compiled] == pytest.approx([h["grad_norm"] for h in eager], rel=1e-6)
    metrics = json.loads((tmp_path / "compiled" / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["compiled_graphs"] == 2 and json.loads((one_process_run / "metrics.json").read_bytes())[
        "compiled_graphs"] == 0
    assert "step 1: torch.compile has compiled 2 graph(s) so far" in result.stdout + result.stderr


@pytest.mark.xdist_group("one_process_run")
def test_fsdp_shards_over_two_processes_and_trains_like_one_process(tmp_path, one_process_run, fsdp_run):
    """`accelerate launch --use_fsdp --fsdp_version 2` with 2 CPU processes: sharded (not DDP in disguise), equal to
    1 process with the same global batch, with validation and beam search inside the run and at its end."""
    fsdp_folder, printed = fsdp_run
    assert "distributed: parallelism FSDP2, processes 2, backend gloo" in printed
    one, fsdp = history(one_process_run), history(fsdp_folder)
    assert [h["tokens"] for h in one] == [h["tokens"] for h in fsdp]
    assert [h["loss"] for h in fsdp] == pytest.approx([h["loss"] for h in one], rel=1e-5)
    assert [h["grad_norm"] for h in fsdp] == pytest.approx([h["grad_norm"] for h in one], rel=1e-5)
    assert [h["validation_loss"] for h in fsdp if "validation_loss" in h] == pytest.approx(
        [h["validation_loss"] for h in one if "validation_loss" in h], rel=1e-5)
    assert_same_weights(one_process_run, fsdp_folder, atol=1e-5, skip=("k_proj.bias",))
    metrics_one, metrics_fsdp = (json.loads((d / "metrics.json").read_text(encoding="utf-8"))
                                 for d in (one_process_run, fsdp_folder))
    assert metrics_fsdp["distributed"]["parallelism"] == "FSDP2"
    total = VaswaniForConditionalGeneration.from_pretrained(fsdp_folder).num_parameters()
    assert metrics_one["distributed"]["parameters_held_by_the_main_process"] == total
    held = metrics_fsdp["distributed"]["parameters_held_by_the_main_process"]
    assert 0.45 * total < held < 0.55 * total  # about half of every tensor
    assert metrics_fsdp["validation"]["loss"] == pytest.approx(metrics_one["validation"]["loss"], rel=1e-5)
    assert metrics_fsdp["test"]["bleu"] == metrics_one["test"]["bleu"]
    # The checkpoints hold the full model, as any run's do, and are model folders with the run's tokenizer and
    # decoding: loaded by from_pretrained, their average is the final folder's model.
    found = checkpoints(fsdp_folder)
    assert [c.name for c in found] == ["checkpoint-2", "checkpoint-4"]
    loaded = [VaswaniForConditionalGeneration.from_pretrained(checkpoint).state_dict() for checkpoint in found]
    for name, tensor in VaswaniForConditionalGeneration.from_pretrained(fsdp_folder).state_dict().items():
        torch.testing.assert_close(tensor, (loaded[0][name] + loaded[1][name]) / 2, atol=1e-7, rtol=1e-6)
    for checkpoint in found:
        assert {"rng_state_0.safetensors", "rng_state_1.safetensors", "optimizer.safetensors"} <= {
            p.name for p in checkpoint.iterdir()}
        assert (checkpoint / "tokenizer.json").read_bytes() == (fsdp_folder / "tokenizer.json").read_bytes()
        generation = GenerationConfig.from_pretrained(checkpoint)
        assert (generation.num_beams, generation.gnmt_alpha) == (4, 0.6)
    # The final folder loads where the package is not installed, and computes what the package computes.
    out = run_hidden("""
        import json, sys, torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
        assert not type(model).__module__.startswith("vaswani_hf")
        with torch.no_grad():
            print(json.dumps(model(input_ids=torch.tensor([[5, 6, 7, 2]]), decoder_input_ids=torch.tensor([[0, 5]])
                             ).logits.flatten().tolist()))
        """, fsdp_folder, env_extra={"HF_MODULES_CACHE": str(tmp_path / "modules")}, cwd=tmp_path)
    installed = VaswaniForConditionalGeneration.from_pretrained(fsdp_folder).eval()
    with torch.no_grad():
        logits = installed(input_ids=torch.tensor([[5, 6, 7, 2]]), decoder_input_ids=torch.tensor([[0, 5]])).logits
    torch.testing.assert_close(torch.tensor(json.loads(out)), logits.flatten(), atol=1e-6, rtol=0)


@pytest.mark.xdist_group("one_process_run")
def test_an_fsdp_run_resumed_from_its_checkpoint_ends_as_the_uninterrupted_one(tmp_path, small_data, fsdp_run):
    """The FSDP run's folder, resumed from its checkpoint of step 2 on 2 processes: the weights and Adam moments
    gathered from the shards into that checkpoint, handed back out to the shards, continue the run as if it never
    stopped. (What a kill leaves behind, and resuming from it, is the same with one process: the tests below.)"""
    run = left_after(fsdp_run[0], "checkpoint-2", tmp_path / "resumed")
    launch(run, *ONE_PROCESS, *small_data, "--resume_from_checkpoint", "latest", processes=2, fsdp=True)
    whole = [h["loss"] for h in history(fsdp_run[0])]
    assert [h["loss"] for h in history(run)] == pytest.approx(whole, rel=1e-6)
    assert_same_weights(run, fsdp_run[0], atol=1e-6)


def test_a_sharded_models_whole_copy_for_evaluation_is_its_weights_saved_as_transformers_saves_them(tmp_path):
    """training/distributed.py under FSDP2 on 2 processes (gloo): a unit per encoder and decoder layer; the main
    process's copy for validation holds the sharded model's weights, is in eval mode, and building it leaves the run's
    random state (its dropout draws) as it was; the gathered state dict names the tensors that `save_pretrained`
    writes, the tied matrix once (§3.4)."""
    script = tmp_path / "whole.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        from types import SimpleNamespace
        import torch
        from safetensors import safe_open
        sys.path.insert(0, sys.argv[1])
        from support import tiny_model
        from training.distributed import full_state_dict, shard, whole_model

        torch.distributed.init_process_group("gloo")
        main = torch.distributed.get_rank() == 0
        plain = tiny_model(seed=1)
        plain.save_pretrained(sys.argv[2])  # (the main process writes)
        accelerator = SimpleNamespace(mixed_precision="no", device=torch.device("cpu"), is_main_process=main)
        model = shard(tiny_model(seed=1).train(), accelerator)
        layers = [*model.model.encoder.layers, *model.model.decoder.layers]
        units = all(isinstance(layer, torch.distributed.fsdp.FSDPModule) for layer in layers)
        gathered = set(full_state_dict(model))  # every process gathers; the main process gets them
        if main:
            with safe_open(sys.argv[2] + "/model.safetensors", "pt") as saved:
                names = set(saved.keys())
        state = torch.get_rng_state()
        copy = whole_model(accelerator, model, lambda: tiny_model(seed=2).train())
        same = not main or all(torch.equal(value, plain.state_dict()[name])
                               for name, value in copy.state_dict().items())
        print(json.dumps({"units": units, "same": same, "eval": not main or not copy.training,
                          "names": not main or gathered == names,
                          "random state": torch.equal(state, torch.get_rng_state())}))
        torch.distributed.destroy_process_group()
        """), encoding="utf-8")
    result = run_forked([Path(__file__).parent, str(tmp_path / "plain")], torch_ranks(), timeout=300, script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in map(json.loads, result.stdout.splitlines()):
        assert rank == {"units": True, "same": True, "eval": True, "names": True, "random state": True}


def test_only_the_last_backward_of_a_step_reduces_gradients_over_the_processes(tmp_path):
    """training/distributed.py's gradient_sync on 2 processes (gloo), each with its own batch: under DDP a backward
    outside the step's last leaves each process its own gradients, and the last makes them equal (the sum of both
    kept); under FSDP the first leaves the sharded gradients unset (accumulated unsharded, not yet reduced)."""
    script = tmp_path / "sync.py"
    script.write_text(textwrap.dedent("""
        import json, sys
        from types import SimpleNamespace
        import torch
        sys.path.insert(0, sys.argv[1])
        from support import tiny_model
        from training.distributed import gradient_sync, shard

        torch.distributed.init_process_group("gloo")
        rank = torch.distributed.get_rank()
        accelerator = SimpleNamespace(mixed_precision="no", device=torch.device("cpu"),
                                      no_sync=lambda model: model.no_sync())

        def backward(model, sync):
            with gradient_sync(accelerator, model, sync):
                source = torch.tensor([[5 + rank, 6 + 2 * rank, 2]])
                model(input_ids=source, decoder_input_ids=source, use_cache=False).logits.sum().backward()

        def everywhere(tensor):
            gathered = [torch.empty_like(tensor) for _ in range(2)]
            torch.distributed.all_gather(gathered, tensor)
            return gathered

        ddp = torch.nn.parallel.DistributedDataParallel(tiny_model(seed=1).train())
        weight = ddp.module.model.encoder.layers[0].fc1.weight
        backward(ddp, sync=False)
        first = weight.grad.clone()
        local = not torch.equal(*everywhere(weight.grad))
        backward(ddp, sync=True)
        reduced = torch.equal(*everywhere(weight.grad))
        kept = torch.equal(*everywhere(weight.grad - first)) is False
        fsdp = shard(tiny_model(seed=1).train(), accelerator)
        backward(fsdp, sync=False)
        unset = all(parameter.grad is None for parameter in fsdp.parameters())
        backward(fsdp, sync=True)
        set_ = all(parameter.grad is not None for parameter in fsdp.parameters())
        print(json.dumps({"local": local, "reduced": reduced, "kept": kept, "unset": unset, "set": set_}))
        torch.distributed.destroy_process_group()
        """), encoding="utf-8")
    result = run_forked([Path(__file__).parent], torch_ranks(), timeout=300, script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    for rank in map(json.loads, result.stdout.splitlines()):
        assert rank == {"local": True, "reduced": True, "kept": True, "unset": True, "set": True}


def test_sharding_makes_a_unit_of_each_layer_then_the_root_in_the_runs_precision_and_says_so(monkeypatch):
    """training/distributed.shard without processes (fully_shard recorded): every encoder and decoder layer, then the
    root, on the run's device; under bf16 or fp16 the parameters compute in that type and the gradients are reduced
    in float32; FSDP_RESHARD_AFTER_FORWARD=false keeps them gathered after the forward. `describe` says the same."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from training import distributed

    calls = []
    monkeypatch.setattr(distributed, "fully_shard", lambda module, **options: calls.append((module, options)))
    for precision, compute, reduce in (("no", None, None), ("bf16", torch.bfloat16, torch.float32),
                                       ("fp16", torch.float16, torch.float32)):
        for variable, reshard in ((None, True), ("False", False), ("true", True)):
            if variable is None:
                monkeypatch.delenv("FSDP_RESHARD_AFTER_FORWARD", raising=False)
            else:
                monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", variable)
            calls.clear()
            model = tiny_model()
            assert distributed.shard(model, SimpleNamespace(mixed_precision=precision, device=torch.device("meta")))
            assert [module for module, _ in calls] == [*model.model.encoder.layers, *model.model.decoder.layers, model]
            policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=reduce)
            assert all(options == {"reshard_after_forward": reshard, "mp_policy": policy} for _, options in calls)
            assert {parameter.device.type for parameter in model.parameters()} == {"meta"}
    monkeypatch.setattr(distributed, "fsdp_requested", lambda: True)
    monkeypatch.setenv("FSDP_RESHARD_AFTER_FORWARD", "false")
    assert distributed.describe(SimpleNamespace(num_processes=4)) == {
        "parallelism": "FSDP2", "processes": 4, "backend": "none", "reshard_after_forward": False,
        "sharding": "torch fully_shard, a unit per encoder and decoder layer and the root (with the shared "
                    "embedding): parameters, gradients and Adam states split 4 ways"}
    monkeypatch.setattr(distributed, "fsdp_requested", lambda: False)
    assert distributed.describe(SimpleNamespace(num_processes=3)) == {
        "parallelism": "DDP", "processes": 3, "backend": "none",
        "sharding": "none: every process holds the whole model"}
    model = tiny_model()
    assert distributed.whole_model(SimpleNamespace(is_main_process=True), model, None) is model  # validated as it is
    assert distributed.whole_model(SimpleNamespace(is_main_process=False), model, None) is None  # by the main alone


def test_every_process_of_a_run_reads_the_main_process_clock(tmp_path):
    """The schedules decide by run.py's clock when a budget ends and a checkpoint is due, in every process of a
    distributed run: each must read the main process's time, or one would stop (or save, a collective step) while
    another waits for it. On 2 processes (gloo) whose own clocks are 1,000 s apart, both read the main one's."""
    script = tmp_path / "clock.py"
    script.write_text(textwrap.dedent("""
        import json, time
        from accelerate import Accelerator
        from training.run import Run

        accelerator = Accelerator(cpu=True)
        run = Run(accelerator, *[None] * 9, {})
        run.start_time -= 1000 * accelerator.process_index
        print(json.dumps({"shared": run.seconds(), "own": run.seconds(shared=False)}))
        accelerator.end_training()
        """), encoding="utf-8")
    ranks = accelerate_ranks(2, "--mixed_precision", "no", "--dynamo_backend", "no", "--multi_gpu", port=free_port())
    result = run_forked([], ranks, timeout=300, script=script)
    assert result.returncode == 0, result.stderr[-3000:]
    main, other = map(json.loads, result.stdout.splitlines())
    assert main["shared"] < 60 and other["shared"] < 60 and other["own"] > 1000


def test_an_fsdp_request_that_cannot_be_honoured_is_a_one_line_error(tmp_path, small_data):
    flags = [*TINY, *small_data, "--max_steps", "2"]
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", "2", "--use_fsdp",
               "--main_process_port", str(free_port())]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    for extra, message in (
            (["--fsdp_version", "1"],
             "error: FSDP version 1 was asked for; this run shards with FSDP2: add --fsdp_version 2"),
            (["--fsdp_version", "2", "--fsdp_offload_params", "true"],
             ("error: FSDP parameter offloading (FSDP_OFFLOAD_PARAMS) is not supported by training/run.py: leave "
              "it off")),
            (["--fsdp_version", "2", "--num_processes", "1"],
             "error: FSDP with one process shards nothing: launch with --num_processes 2 or more")):
        result = subprocess.run([*command, *extra, str(ROOT / "training" / "run.py"), "--output_dir",
                                 str(tmp_path / "run"), *flags], env=env, capture_output=True, text=True, timeout=300,
                                check=False)
        assert result.returncode != 0 and message in result.stderr.splitlines(), result.stderr[-2000:]
        assert result.stderr.count(message) == 1, result.stderr[-2000:]  # said once, not once per process
        assert not (tmp_path / "run").exists()


def test_a_streamed_run_on_two_processes_resumed_from_a_checkpoint_ends_as_the_uninterrupted_one(tmp_path,
                                                                                                small_data):
    """--streaming, two processes, each its own half of the JSON stream in buffers of 50 pairs: resumed from the
    checkpoint of step 4 (which holds each process's place in its stream, in the middle of a buffer), it trains on
    what the run that never stopped trained on: the same losses and weights. (A kill leaves that checkpoint as the
    latest: the one-process tests.)"""
    flags = [*TINY, *small_data, "--streaming", "--bpe_sample", "500", "--shuffle_buffer", "50", "--dropout", "0.1",
             "--max_steps", "6", "--save_steps", "2", "--average_checkpoints", "2"]  # keeps checkpoint-4
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    launch(whole, *flags, processes=2)
    left_after(whole, "checkpoint-4", resumed)
    stream = json.loads((resumed / "checkpoint-4" / "trainer_state.json").read_text(encoding="utf-8"))["stream"]
    assert len(stream) == 2 and all(place["buffer"] > 0 and place["taken"] > 0 for place in stream)
    result = launch(resumed, *flags, "--resume_from_checkpoint", "latest", processes=2)
    assert "training pairs streamed" in result.stdout + result.stderr
    assert [h["loss"] for h in history(resumed)] == pytest.approx([h["loss"] for h in history(whole)], rel=1e-6)
    assert_same_weights(resumed, whole, atol=1e-6)
    card = (resumed / "README.md").read_text(encoding="utf-8")
    assert "learned from the first 500 training pairs" in card and "streamed, grouped by length 50 at a time" in card
    assert "train pairs streamed" in card


@pytest.mark.xdist_group("whole_run")
def test_killed_in_a_step_in_a_save_and_in_averaging_and_resumed_each_time_ends_as_an_uninterrupted_run(
        tmp_path, small_data, whole_run):
    """Each kill is SIGKILL, as from outside (nothing is cleaned up): inside step 3, while checkpoint 6 is written,
    and after averaging, before the output folder is written. The last resume has a cache it cannot write: a
    resumed run computes with its checkpoint's fast_cpu plan and needs none."""
    flags = [*WHOLE, *small_data]
    run, resume = tmp_path / "killed", ["--resume_from_checkpoint", "latest"]

    launch(run, *flags, env_extra={"VASWANI_FAULT": "step-3"}, status=-signal.SIGKILL)
    assert [p.name for p in checkpoints(run)] == ["checkpoint-2"]
    launch(run, *flags, *resume, env_extra={"VASWANI_FAULT": "save-6"}, status=-signal.SIGKILL)
    assert [p.name for p in checkpoints(run)] == ["checkpoint-2", "checkpoint-4"]
    assert (run / ".incomplete-checkpoint-6" / "model.safetensors").is_file()
    launch(run, *flags, *resume, env_extra={"VASWANI_FAULT": "average"}, status=-signal.SIGKILL)
    assert [p.name for p in checkpoints(run)] == ["checkpoint-6", "checkpoint-8"]
    assert not (run / "model.safetensors").exists()
    (tmp_path / "file").write_text("", encoding="utf-8")
    launch(run, *flags, *resume, env_extra={"VASWANI_HF_CACHE": str(tmp_path / "file" / "cache")})

    assert not list(run.glob(".incomplete-*"))
    assert [h["loss"] for h in history(run)] == pytest.approx([h["loss"] for h in history(whole_run)], rel=1e-6)
    assert_same_weights(run, whole_run, atol=1e-6)


@pytest.mark.xdist_group("whole_run")
def test_a_full_disk_stops_the_run_in_one_line_naming_its_intact_checkpoint_and_the_resumed_run_ends_as_one_run(
        tmp_path, small_data, whole_run, monkeypatch, capsys):
    """The disk full while checkpoint 8 is written (safetensors' error), then while the output folder is (an
    OSError): each time the run stops in one line naming the newest intact checkpoint, below the progress bar (closed:
    the line does not run on from it), the part of the checkpoint written removed. Resumed once there is room, it ends
    as the uninterrupted run."""
    from safetensors import SafetensorError

    import training.run
    from training import checkpoints as checkpoints_module

    run, flags = left_after(whole_run, "checkpoint-6", tmp_path / "full"), [*WHOLE, *small_data]
    resume, room = ["--resume_from_checkpoint", "latest"], "make room, then add --resume_from_checkpoint latest"
    full = "Error while serializing: I/O error: No space left on device (os error 28)"  # (safetensors' words)
    save_file = checkpoints_module.save_file
    with monkeypatch.context() as patch:
        patch.setattr(checkpoints_module, "save_file",
                      lambda *args, **kwargs: save_file(*args, **kwargs) or throw(SafetensorError(full)))
        with pytest.raises(SystemExit) as stop:
            train_here(run, *flags, *resume)
    said = f"error: checkpoint-8 could not be written in {run} ({full}): checkpoint-6 is intact; {room}"
    assert stop.value.code == said and capsys.readouterr().err.endswith("\n")
    assert sorted(path.name for path in run.iterdir() if "checkpoint" in path.name) == ["checkpoint-6"]
    with monkeypatch.context() as patch:
        patch.setattr(training.run, "write_output_folder",
                      lambda *args, **kwargs: throw(OSError(errno.ENOSPC, "No space left on device")))
        with pytest.raises(SystemExit) as stop:
            train_here(run, *flags, *resume)
    assert stop.value.code == (f"error: the model could not be written in {run} ([Errno 28] No space left on "
                               f"device): checkpoint-8 is intact; {room}")
    train_here(run, *flags, *resume)
    assert_same_weights(run, whole_run, atol=1e-6)
    assert [h["loss"] for h in history(run)] == pytest.approx([h["loss"] for h in history(whole_run)], rel=1e-6)


@pytest.mark.xdist_group("whole_run")
def test_ctrl_c_stops_the_run_in_one_line_and_the_resumed_run_ends_as_one_run(tmp_path, small_data, whole_run,
                                                                            monkeypatch, capsys):
    """Ctrl-C inside step 3 (after the gradients, before the update): one line on how to go on, the status of a
    SIGINT, no traceback; resumed, the run ends as the one never stopped."""
    import training.run

    def interrupted_at_step_3(point: str) -> None:
        if point == "step-3":
            raise KeyboardInterrupt

    run, flags = tmp_path / "stopped", [*WHOLE, *small_data]
    with monkeypatch.context() as patch:
        patch.setattr(training.run, "fault_point", interrupted_at_step_3)
        with pytest.raises(SystemExit) as stop:
            train_here(run, *flags)
    assert stop.value.code == 130
    assert capsys.readouterr().err.splitlines()[-1] == ("stopped: the same command with --resume_from_checkpoint "
                                                        "latest goes on from the newest intact checkpoint")
    assert [path.name for path in checkpoints(run)] == ["checkpoint-2"]
    train_here(run, *flags, "--resume_from_checkpoint", "latest")
    assert_same_weights(run, whole_run, atol=1e-6)


@pytest.mark.xdist_group("whole_run")
def test_sigterm_under_jit_checkpointing_saves_after_the_step_and_the_resumed_run_ends_as_one_run(
        tmp_path, small_data, whole_run, monkeypatch, capsys):
    """--enable_jit_checkpoint: two SIGTERMs inside step 5 (a launcher passing on the one its process had) give one
    checkpoint after the step, beside the schedule's 2 and 4 (--average_checkpoints 2 keeps the schedule's), one line
    on receiving it, one on stopping, and SIGTERM's status. Resumed, the next checkpoint replaces it and the run ends
    as the one never stopped."""
    import training.run

    def terminated_twice_at_step_5(point: str) -> None:
        if point == "step-5":
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)

    run, flags = tmp_path / "preempted", [*WHOLE, *small_data, "--enable_jit_checkpoint"]
    handler = signal.getsignal(signal.SIGTERM)
    with monkeypatch.context() as patch:
        patch.setattr(training.run, "fault_point", terminated_twice_at_step_5)
        with pytest.raises(SystemExit) as stop:
            train_here(run, *flags)
    assert stop.value.code == 128 + signal.SIGTERM and signal.getsignal(signal.SIGTERM) == handler
    said = capsys.readouterr().err
    assert said.count("SIGTERM: a checkpoint after this step, then the run stops") == 1
    assert said.endswith("\nstopped at step 5 (SIGTERM), its checkpoint written: the same command with "
                         "--resume_from_checkpoint latest goes on\n")
    assert [(path.name, preempted(path)) for path in checkpoints(run)] == [
        ("checkpoint-2", False), ("checkpoint-4", False), ("checkpoint-5", True)]
    train_here(run, *flags, "--resume_from_checkpoint", "latest")
    assert [path.name for path in checkpoints(run)] == ["checkpoint-6", "checkpoint-8"]
    assert [h["loss"] for h in history(run)] == pytest.approx([h["loss"] for h in history(whole_run)], rel=1e-6)
    assert_same_weights(run, whole_run, atol=1e-6)


def test_sigterms_in_a_step_the_schedule_saves_and_in_the_last_step_leave_checkpoints_averaged_as_the_schedules(
        tmp_path, small_data, monkeypatch):
    """A SIGTERM in step 2, which the schedule (--save_steps 2) saves: that checkpoint alone, the schedule's. Resumed,
    a SIGTERM in step 3 of 3, which it does not save: a SIGTERM checkpoint. Resumed again, the run has no step to
    make; it writes step 3's checkpoint as its last, as the uninterrupted run does, and averages it with checkpoint
    2."""
    run, flags = tmp_path / "last", [*TINY, *small_data, "--max_steps", "3", "--save_steps", "2",
                                      "--average_checkpoints", "2", "--enable_jit_checkpoint"]
    for step, resumed in ((2, []), (3, ["--resume_from_checkpoint", "latest"])):
        with monkeypatch.context() as patch:
            patch.setenv("VASWANI_FAULT", f"step-{step}:SIGTERM")
            with pytest.raises(SystemExit):
                train_here(run, *flags, *resumed)
        assert [(path.name, preempted(path)) for path in checkpoints(run)] == [
            ("checkpoint-2", False), *[("checkpoint-3", True)] * (step == 3)]
    train_here(run, *flags, "--resume_from_checkpoint", "latest")
    assert [(path.name, preempted(path)) for path in checkpoints(run)] == [
        ("checkpoint-2", False), ("checkpoint-3", False)]
    assert json.loads((run / "metrics.json").read_text(encoding="utf-8"))["averaged_checkpoints"] == [
        "checkpoint-2", "checkpoint-3"]


def test_a_run_whose_loss_is_not_finite_stops_in_one_line_before_its_next_checkpoint(tmp_path, small_data):
    """At --lr_scale 100000 the loss explodes after step 1 and is NaN a step or two later. The run stops at the next
    reading of its losses (here the one before checkpoint 4), naming the first step whose loss is not finite: no
    checkpoint of NaNs, no model. (It went on to its end, then wrote a model of NaNs, a card and a test BLEU of 0.)"""
    run = tmp_path / "diverged"
    with pytest.raises(SystemExit) as stop:
        train_here(run, *TINY, *small_data, "--max_steps", "8", "--save_steps", "4", "--logging_steps", "8",
                   "--lr_scale", "100000")
    said = re.fullmatch(r"error: the loss is nan at step (\d): the run has diverged, its weights are lost from that "
                        r"step on \(a lower --lr_scale may keep it finite\)", stop.value.code)
    assert said and int(said[1]) <= 4, stop.value.code
    assert [path.name for path in checkpoints(run)] == [] and not (run / "model.safetensors").exists()


def test_without_jit_checkpointing_sigterm_ends_the_run_at_once(tmp_path, small_data):
    """SIGTERM's meaning by default: the run ends where it is (inside step 3), with the checkpoints it had."""
    run = tmp_path / "terminated"
    launch(run, *WHOLE, *small_data, env_extra={"VASWANI_FAULT": "step-3:SIGTERM"}, status=-signal.SIGTERM)
    assert [path.name for path in checkpoints(run)] == ["checkpoint-2"]


@pytest.mark.xdist_group("whole_run")
def test_a_run_resumed_with_other_training_data_goes_on_with_its_own_tokenizer(tmp_path, small_data, whole_run):
    """Resumed with other training files (the data moved, a file changed), the run goes on with the BPE in its
    folder, whose ids its weights learned: it learns none anew from the data given (300 other pairs, whose BPE of 300
    entries differs)."""
    other = tmp_path / "other.jsonl"
    other.write_text("".join(json.dumps({"translation": {"en": en, "de": de}}) + "\n"
                             for en, de in generate()["train"][2000:2300]), encoding="utf-8")
    bpe = (whole_run / "tokenizer.json").read_text(encoding="utf-8")
    anew = train_joint_bpe([text for pair in generate()["train"][2000:2300] for text in pair], 300)
    assert anew.get_vocab() != AutoTokenizer.from_pretrained(whole_run).get_vocab()  # the premise
    run = left_after(whole_run, "checkpoint-6", tmp_path / "resumed")
    train_here(run, *WHOLE, *small_data, "--train_file", str(other), "--resume_from_checkpoint", "latest")
    assert (run / "tokenizer.json").read_text(encoding="utf-8") == bpe
    assert history(run)[-1]["step"] == 8


@pytest.mark.xdist_group("whole_run")
def test_a_reused_output_folder_is_refused_and_overwriting_starts_afresh(tmp_path, small_data, whole_run, capfd):
    flags = [*WHOLE, *small_data]
    run = tmp_path / "run"
    shutil.copytree(whole_run, run)  # a finished run's folder
    first_weights = (run / "model.safetensors").read_bytes()
    other = [*flags, "--max_steps", "2", "--vocab_size", "200"]
    capfd.readouterr()
    with pytest.raises(SystemExit) as stop:
        train_here(run, *other)
    assert capfd.readouterr().err == "" and stop.value.code == (
        f"error: --output_dir {run} is not empty: resume its run with --resume_from_checkpoint latest, replace it "
        "with --overwrite_output_dir, or choose another folder")
    assert (run / "model.safetensors").read_bytes() == first_weights

    train_here(run, *other, "--overwrite_output_dir")
    metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["train_steps"] == 2 and metrics["averaged_checkpoints"] == ["checkpoint-2"]
    assert [p.name for p in checkpoints(run)] == ["checkpoint-2"]
    assert json.loads((run / "config.json").read_bytes())["vocab_size"] <= 200  # a new BPE, not the first run's


@pytest.mark.xdist_group("whole_run")
def test_resuming_another_runs_checkpoint_or_with_another_model_is_refused_before_anything_changes(
        tmp_path, small_data, whole_run):
    """A checkpoint named by path must be one of --output_dir's, and the model flags must be the checkpoint's."""
    flags = [*WHOLE, *small_data, "--resume_from_checkpoint"]
    run, other, untokenized = tmp_path / "run", tmp_path / "other", tmp_path / "untokenized"
    for folder in (run, other, untokenized):
        shutil.copytree(whole_run, folder)
    (untokenized / "tokenizer.json").unlink()  # the BPE that the checkpoints' ids mean
    before = sorted(str(p.relative_to(run)) for p in run.rglob("*"))
    for folder, extra, message in (
            (run, [str(other / "checkpoint-8")],
             f"error: --resume_from_checkpoint {other / 'checkpoint-8'} is not a checkpoint of --output_dir {run}"),
            (run, ["latest", "--d_model", "64", "--d_ff", "128"],
             (f"error: {run / 'checkpoint-8'} holds another model: --d_model 64 (the checkpoint's: 32), --d_ff 128 "
              "(the checkpoint's: 64)")),
            (untokenized, ["latest"],
             f"error: --output_dir {untokenized} has no tokenizer.json: the run's tokenizer is needed to resume it")):
        with pytest.raises(SystemExit) as stop:
            train_here(folder, *flags, *extra)
        assert stop.value.code == message
    assert sorted(str(p.relative_to(run)) for p in run.rglob("*")) == before
    assert not (untokenized / "tokenizer.json").exists()


# A fine-tuning run of translation_folder's model (d_model 24): run.py's recipe flags, no model flags.
FINE_TUNING = ["--max_tokens", "400", "--tokens_per_step", "800", "--warmup_steps", "4", "--eval_steps", "0",
               "--logging_steps", "1", "--seed", "3", "--max_steps", "2", "--save_steps", "1",
               "--average_checkpoints", "2"]


def test_a_fine_tuning_run_starts_from_the_models_weights_and_tokenizer_and_its_card_names_it(
        tmp_path, small_data, translation_folder):
    """--model_name_or_path: two Adam steps at a peak of about 1e-7 (lr_scale 1e-6) leave every weight within 1e-6 of
    the folder's, where a new model's would be far; the sizes, tokenizer and paper's decoding are the folder's, the
    dropout the flag's (the recipe's, §5.4); the card names the folder it started from, without its path, and no model
    flags."""
    output = tmp_path / "tuned"
    train_here(output, *FINE_TUNING, *small_data, "--model_name_or_path", translation_folder, "--lr_scale", "1e-6",
               "--dropout", "0.25")
    assert_same_weights(translation_folder, output, atol=1e-6)
    sizes = ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers", "num_decoder_layers")
    first, last = ({size: json.loads((folder / "config.json").read_text(encoding="utf-8"))[size] for size in sizes}
                   for folder in (translation_folder, output))
    assert first == last
    assert json.loads((translation_folder / "config.json").read_text(encoding="utf-8"))["dropout"] == 0
    for folder in (output, output / "checkpoint-1"):  # the trained model's, not the final copy's alone
        assert json.loads((folder / "config.json").read_text(encoding="utf-8"))["dropout"] == 0.25
    assert (output / "tokenizer.json").read_bytes() == (translation_folder / "tokenizer.json").read_bytes()
    assert json.loads((output / "generation_config.json").read_text(encoding="utf-8"))["gnmt_alpha"] == 0.6
    card = (output / "README.md").read_text(encoding="utf-8")
    assert (f"- recipe: fine-tuned from the local model folder {translation_folder.name}, its weights and tokenizer, "
            "not from the paper's initialization") in card
    assert "base_model" not in card and str(translation_folder.parent) not in card and '"d_model"' not in card
    assert "Recipe (§5): the tokenizer of the model it was fine-tuned from, batches grouped by length" in card


@pytest.mark.xdist_group("whole_run")
def test_a_fine_tuning_run_resumed_ends_as_the_uninterrupted_one_and_resuming_without_its_start_is_refused(
        tmp_path, small_data, translation_folder, whole_run):
    """A resumed fine-tuning run continues from its checkpoint in the start's sizes, to the uninterrupted run's
    weights; resumed without its --model_name_or_path or with another dropout, or a new model's run resumed with one,
    is refused in one line before anything changes."""
    flags = [*FINE_TUNING, *small_data, "--model_name_or_path", translation_folder]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train_here(whole, *flags)
    train_here(left_after(whole, "checkpoint-1", resumed), *flags, "--resume_from_checkpoint", "latest")
    assert_same_weights(whole, resumed, atol=0)
    assert [entry["loss"] for entry in history(resumed)] == [entry["loss"] for entry in history(whole)]
    before = sorted(map(str, whole.rglob("*")))
    for folder, argv, message in (
            (whole, [*FINE_TUNING, *small_data], (f"error: {whole / 'checkpoint-2'} fine-tunes {translation_folder}: "
                                                  f"resume with --model_name_or_path {translation_folder}")),
            (whole, [*flags, "--dropout", "0.3"],
             f"error: {whole / 'checkpoint-2'} holds another model: --dropout 0.3 (the checkpoint's: 0.0)"),
            (whole_run, flags, (f"error: {whole_run / 'checkpoint-8'} trains a new model: resume without "
                                "--model_name_or_path"))):
        with pytest.raises(SystemExit) as stop:
            train_here(folder, *argv, "--resume_from_checkpoint", "latest")
        assert stop.value.code == message
    assert sorted(map(str, whole.rglob("*"))) == before


def test_a_greedy_run_saves_its_checkpoints_and_a_model_of_one_beam_and_tries_no_alpha(tmp_path, small_data):
    """--num_beams 1 (the paper's search with one beam is greedy): transformers refuses to save a generation config
    that stops a beam search early beside one beam, and the run died at its first checkpoint. Greedy decoding has no
    α to choose: the candidates a preset gives are not tried, nor named in the card."""
    run = tmp_path / "run"
    train_here(run, *TINY, *small_data, "--max_steps", "2", "--save_steps", "1", "--average_checkpoints", "2",
               "--num_beams", "1", "--alpha_candidates", "0.6", "1.0")
    assert [p.name for p in checkpoints(run)] == ["checkpoint-1", "checkpoint-2"]
    assert GenerationConfig.from_pretrained(run).num_beams == 1
    assert "alpha_search" not in json.loads((run / "metrics.json").read_text(encoding="utf-8"))
    assert "GNMT α chosen" not in (run / "README.md").read_text(encoding="utf-8")


def test_a_run_into_english_scores_table_2s_bleu_with_englishs_moses_tokens(tmp_path, small_data):
    """--target_lang names the Moses tokenizer that Table 2's BLEU reads the translations with, in validation's α
    choice and the test alike: de -> en here, not German's."""
    train_here(tmp_path / "run", *TINY, *small_data, "--source_lang", "de", "--target_lang", "en", "--max_steps", "1")
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text(encoding="utf-8"))
    for split in ("validation", "test"):
        assert metrics[split]["bleu_tokenized_signature"].startswith("moses:en|compounds:split|"), split


def test_a_run_logs_to_the_trackers_report_to_names(tmp_path, small_data):
    """tensorboard by default, in the output folder; `--report_to none`: no tracker."""
    for report_to, logged in ((["tensorboard"], True), (["none"], False)):
        run = tmp_path / report_to[0]
        train_here(run, *TINY, *small_data, "--max_steps", "1", "--report_to", *report_to)
        assert any((run / "vaswani").glob("events.out.tfevents.*")) is logged


def test_the_trackers_report_to_names_reach_accelerate(tmp_path, small_data, monkeypatch):
    """Each tracker named, as named: here Accelerate is asked for them and given none (neither is installed)."""
    from accelerate import Accelerator, tracking

    import training.run

    asked = []

    class Recorded(Accelerator):
        def __init__(self, *args, log_with=None, **kwargs):
            asked.append(log_with)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(training.run, "Accelerator", Recorded)
    monkeypatch.setattr(tracking, "get_available_trackers", lambda: list(tracking.LoggerType))
    train_here(tmp_path / "run", *TINY, *small_data, "--max_steps", "1", "--report_to", "wandb", "mlflow")
    assert asked == [["wandb", "mlflow"]]


@pytest.mark.parametrize("converted", [False, True])
def test_a_runs_decoding_with_one_beam_is_a_generation_config_transformers_saves(tmp_path, converted):
    """A new model's decoding (the paper's search) and a converted start's (transformers' beam search as it was
    published, with an early stop and a length penalty: settings of a beam search only), given one beam."""
    generation = (GenerationConfig(num_beams=4, length_penalty=0.6, early_stopping=True) if converted else
                  GenerationConfig.from_model_config(tiny_model().config))
    assert set_run_decoding(generation, 1, 0.6) == (None if converted else 0.6)
    generation.save_pretrained(tmp_path)  # transformers validates it strictly
    assert GenerationConfig.from_pretrained(tmp_path).num_beams == 1


def test_resuming_from_an_older_checkpoint_leaves_its_successors_out_of_the_run(tmp_path, small_data):
    """A finished run resumed in its folder from checkpoint-2: the later checkpoints leave the run, and it reads the
    pairs' tokens the finished run wrote, though its model folder was saved over the tokenizer (WMT's 4.5M pairs take
    a minute or more to tokenize again)."""
    flags = [*TINY, *small_data, "--max_steps", "6", "--save_steps", "2", "--average_checkpoints", "3"]
    run = tmp_path / "run"
    train_here(run, *flags)
    assert [p.name for p in checkpoints(run)] == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    tokens = [(path.name, path.stat().st_ino, path.stat().st_mtime_ns) for path in sorted((run / "tokens").iterdir())]
    train_here(run, *flags, "--save_steps", "3", "--resume_from_checkpoint", str(run / "checkpoint-2"))
    assert [(path.name, path.stat().st_ino, path.stat().st_mtime_ns)
            for path in sorted((run / "tokens").iterdir())] == tokens
    assert [p.name for p in checkpoints(run)] == ["checkpoint-2", "checkpoint-3", "checkpoint-6"]
    assert json.loads((run / "metrics.json").read_text(encoding="utf-8"))["averaged_checkpoints"] == [
        "checkpoint-2", "checkpoint-3", "checkpoint-6"]
    assert (run / "abandoned-checkpoint-4").is_dir() and (run / "abandoned-checkpoint-6").is_dir()


def test_a_budgeted_run_writes_its_schedule_and_replaying_it_gives_the_same_weights(tmp_path, small_data,
                                                                                     monkeypatch):
    """A run fitted to 3 seconds on the clock run.py reads, moved on 1/8 s at every step's end and by nothing else,
    steps until the clock has passed 3 s (25 steps); schedule.json records what it fitted. On a machine three times
    as slow (3/8 s a step) the same command makes 9 steps; with --replay_schedule it makes the first run's 25 and
    saves the same weights, byte for byte: the same command gives the same weights on a quiet and a busy machine."""
    import training.run

    moved = {"seconds": 0.0, "step": 0.125}  # sums of eighths: exact in binary

    def step_ended(point):  # run.py's fault points: one at each step's end
        if point.startswith("step-"):
            moved["seconds"] += moved["step"]

    monkeypatch.setattr(training.run, "fault_point", step_ended)
    monkeypatch.setattr(training.run, "time", SimpleNamespace(time=lambda: moved["seconds"]))
    flags = [*TINY, "--max_train_minutes", "0.05", "--max_steps", "100000", "--warmup_share", "0.2",
             "--average_checkpoints", "2", "--average_share", "0.3", "--dropout_epochs", "0", "1", *small_data]
    train_here(tmp_path / "run", *flags)
    schedule = json.loads((tmp_path / "run" / "schedule.json").read_text(encoding="utf-8"))
    steps = json.loads((tmp_path / "run" / "metrics.json").read_text(encoding="utf-8"))["train_steps"]
    assert schedule["steps"] == steps == 25 and len(schedule["expected_steps"]) == steps
    assert len(schedule["checkpoints"]) >= 2 and schedule["warmup_steps"] >= 1
    moved.update(seconds=0.0, step=0.375)
    train_here(tmp_path / "slow", *flags)
    assert json.loads((tmp_path / "slow" / "schedule.json").read_bytes())["steps"] == 9  # what replay must undo
    moved["seconds"] = 0.0
    train_here(tmp_path / "replayed", *flags, "--replay_schedule", tmp_path / "run" / "schedule.json")
    assert json.loads((tmp_path / "replayed" / "schedule.json").read_text(encoding="utf-8")) == schedule
    for name in ("model.safetensors", f"checkpoint-{steps}/model.safetensors",
                 f"checkpoint-{steps}/optimizer.safetensors", f"checkpoint-{steps}/rng_state_0.safetensors"):
        assert (tmp_path / "replayed" / name).read_bytes() == (tmp_path / "run" / name).read_bytes(), name


def test_a_budgeted_run_resumed_saves_validates_and_ends_as_the_uninterrupted_one(tmp_path, small_data,
                                                                                    monkeypatch):
    """A 2-minute budget on the clock run.py reads, moved on 10 s at every step's end and by nothing else: 13 steps,
    validated every 30 s (3 times), a checkpoint every 20 s over the last half (the newest 3 kept and averaged).
    Resumed from its checkpoint of step 10, the run goes on from that checkpoint's seconds: it validates, saves and
    ends where the run that never stopped did, with its weights. (Counted from 0 seconds, its first step would cross
    every interval since the run's start: a checkpoint and a validation more.)"""
    import training.run

    moved = {"seconds": 0.0}

    def step_ended(point):  # run.py's fault points: one at each step's end
        if point.startswith("step-"):
            moved["seconds"] += 10

    monkeypatch.setattr(training.run, "fault_point", step_ended)
    monkeypatch.setattr(training.run, "time", SimpleNamespace(time=lambda: moved["seconds"]))
    flags = [*TINY, *small_data, "--dropout", "0.1", "--max_train_minutes", "2", "--max_steps", "1000",
             "--warmup_share", "0.2", "--evaluations", "3", "--eval_max_sentences", "2", "--average_checkpoints", "3",
             "--average_share", "0.5"]
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    train_here(whole, *flags)
    schedule = json.loads((whole / "schedule.json").read_text(encoding="utf-8"))
    assert schedule["steps"] == 13 and schedule["evaluations"] == [3, 6, 9]
    assert schedule["checkpoints"] == [2, 4, 6, 8, 10, 12]
    train_here(left_after(whole, "checkpoint-10", resumed), *flags, "--resume_from_checkpoint", "latest")
    assert json.loads((resumed / "schedule.json").read_text(encoding="utf-8")) == schedule
    assert [p.name for p in checkpoints(resumed)] == ["checkpoint-10", "checkpoint-12", "checkpoint-13"]
    assert_same_weights(whole, resumed, atol=0)


def test_save_minutes_count_from_the_last_checkpoint_and_train_minutes_cover_every_step(tmp_path, small_data,
                                                                                      monkeypatch):
    """--save_minutes 4 on the clock run.py reads, moved on 100 s at every step's end: checkpoints after steps 3 and 6
    (300 s after the last each), the last one after step 8, 200 s later; metrics.json's train_minutes are the 800 s
    of the 8 steps, not the 600 s at the last checkpoint the loop wrote. Resumed from checkpoint 6, the run counts
    from it too."""
    import training.run

    moved = {"seconds": 0.0}

    def step_ended(point):  # run.py's fault points: one at each step's end
        if point.startswith("step-"):
            moved["seconds"] += 100

    monkeypatch.setattr(training.run, "fault_point", step_ended)
    monkeypatch.setattr(training.run, "time", SimpleNamespace(time=lambda: time.time() + moved["seconds"]))
    flags = [*TINY, *small_data, "--max_steps", "8", "--save_minutes", "4", "--average_checkpoints", "2"]
    train_here(tmp_path / "run", *flags)
    state = json.loads((tmp_path / "run" / "checkpoint-8" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["schedule"]["checkpoints"] == [3, 6] and [p.name for p in checkpoints(tmp_path / "run")] == [
        "checkpoint-6", "checkpoint-8"]
    assert 800 <= 60 * json.loads((tmp_path / "run" / "metrics.json").read_bytes())["train_minutes"] < 900
    resumed = left_after(tmp_path / "run", "checkpoint-6", tmp_path / "resumed")  # counts from 600 s: no save at 7
    train_here(resumed, *flags, "--resume_from_checkpoint", "latest")
    state = json.loads((resumed / "checkpoint-8" / "trainer_state.json").read_text(encoding="utf-8"))
    assert state["schedule"]["checkpoints"] == [3, 6]


def test_a_budget_counts_training_not_validation(tmp_path, small_data, monkeypatch):
    """--max_train_minutes 20 on the clock run.py reads, moved on 100 s at every step's end and 2,000 s by each
    validation (a parser's beam of 21 on a CPU): 12 steps, as without validations, validated after the 4th and the 8th
    (--evaluations 2), the schedule fitted to 12 (were validation counted, the run would end at the first)."""
    import training.run

    moved = {"seconds": 0.0}

    def step_ended(point):  # run.py's fault points: one at each step's end
        if point.startswith("step-"):
            moved["seconds"] += 100

    def validation(*args, **kwargs):
        moved["seconds"] += 2000
        return evaluate_model(*args, **kwargs)

    monkeypatch.setattr(training.run, "fault_point", step_ended)
    monkeypatch.setattr(training.run, "evaluate_model", validation)
    monkeypatch.setattr(training.run, "time", SimpleNamespace(time=lambda: time.time() + moved["seconds"]))
    train_here(tmp_path / "run", *TINY, *small_data, "--max_train_minutes", "20", "--evaluations", "2",
               "--eval_max_sentences", "2", "--average_checkpoints", "1")
    schedule = json.loads((tmp_path / "run" / "schedule.json").read_text(encoding="utf-8"))
    assert schedule["steps"] == 12 and schedule["evaluations"] == [4, 8]
    assert round(schedule["expected_steps"][-1]) == 12
    assert 1200 <= 60 * json.loads((tmp_path / "run" / "metrics.json").read_bytes())["train_minutes"] < 1300


@pytest.mark.xdist_group("whole_run")
def test_validation_during_training_leaves_the_training_as_it_was(tmp_path, small_data, whole_run):
    """Validation (loss and beam search) between steps: the steps after it are those of a run without it, dropout
    included (the model goes back to training mode)."""
    train_here(tmp_path / "validated", *WHOLE, *small_data, "--eval_steps", "2", "--eval_max_sentences", "4")
    validated = history(tmp_path / "validated")
    assert sum("validation_loss" in h for h in validated) == 4
    assert [h["loss"] for h in validated] == [h["loss"] for h in history(whole_run)]


def test_without_cpu_affinity_a_runs_processes_share_every_core(tmp_path, monkeypatch):
    """macOS and Windows have no `os.sched_getaffinity`: there run.py's processes share every core of the machine, as
    on Linux they share the cores of their affinity (here one: conftest.py pins each test worker to a core of its
    own). Before, the run stopped at once with an AttributeError. `torch.set_num_threads` is recorded, not called."""
    import training.run

    threads, affinity = [], len(os.sched_getaffinity(0))
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(training.run, "keep_freed_memory", lambda: None)
    args = SimpleNamespace(output_dir=str(tmp_path), mixed_precision="no", deterministic=False, seed=0,
                           report_to=["tensorboard"])
    with accelerate_as_in_a_new_process():
        training.run.start_processes(args)
        monkeypatch.delattr(os, "sched_getaffinity")
        monkeypatch.delattr(psutil.Process, "cpu_affinity")  # nor psutil's (joblib's next try) on macOS
        training.run.start_processes(args)
    assert threads == [affinity, os.cpu_count()]


def test_usable_cores_are_the_fewest_of_the_machines_the_affinitys_and_a_limits(monkeypatch):
    """`usable_cores` (run.py's threads, its tokenizing workers, vaswani-translate's threads at most): joblib's count,
    bounded by the process's affinity (`taskset`, a cluster job's cpuset) and by a limit (a container's CPU quota, for
    which LOKY_MAX_CPU_COUNT stands here: joblib takes the fewest of them alike), never the machine's count alone."""
    from vaswani_hf.speed.kernels import usable_cores

    monkeypatch.delenv("LOKY_MAX_CPU_COUNT", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 8)  # a machine of 8 cores
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3})  # 4 of them given to the process
    assert usable_cores() <= 4  # fewer under a container's limit where the suite runs in one
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "1")
    assert usable_cores() == 1
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # `taskset -c 0`
    monkeypatch.setenv("LOKY_MAX_CPU_COUNT", "3")
    assert usable_cores() == 1


def test_a_runs_cpu_processes_each_thread_over_their_share_of_the_cores(monkeypatch):
    """16 usable cores: one process threads over 16, two over 8 each, three over 5, more processes than cores over 1
    (the test workers' single cores cannot show it in a run)."""
    import training.distributed

    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    monkeypatch.setattr(training.distributed, "usable_cores", lambda: 16)
    for processes in (1, 2, 3, 32):
        training.distributed.share_cores(processes)
    assert threads == [16, 8, 5, 1]


def test_a_training_step_builds_no_decoding_cache(monkeypatch):
    """run.py's step computes its own loss, without labels: it must still ask for no cache, which would copy each
    layer's keys and values (and, on an H100, launch some 50 kernels a step for nothing)."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from transformers.cache_utils import EncoderDecoderCache

    import vaswani_hf.modeling_vaswani
    from training.batching import collate
    from training.step import TrainingStep

    class Refused(EncoderDecoderCache):
        def __init__(self, *args, **kwargs):
            raise AssertionError("a training step built a decoding cache")

    monkeypatch.setattr(vaswani_hf.modeling_vaswani, "EncoderDecoderCache", Refused)
    model = tiny_model().train()
    sources, targets = [[5, 6, 7], [8, 9]], [[10, 11, 2], [12, 2]]
    try:
        accelerator = Accelerator(cpu=True)
        loss, tokens = TrainingStep(accelerator, model, 0.1)([collate(range(2), sources, targets, 0, "cpu")], 5)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    assert tokens == 5 and loss > 0 and all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize("precision, trained_with, trained_in", [("bf16", "eager", "bf16"), ("auto", "sdpa", "no")])
def test_a_cpu_run_under_bfloat16_trains_with_eager_attention_and_saves_a_model_of_sdpa(tmp_path, small_data,
                                                                                      monkeypatch, precision,
                                                                                      trained_with, trained_in):
    """On a CPU under bfloat16 autocast a run's steps attend by transformers' eager attention, not SDPA's fused
    kernel, whose bfloat16 backward took 15x float32's (training/step.py); a float32 run's steps (`auto` on a CPU)
    keep SDPA. The model the run saves attends by SDPA either way, and its card's recipe names the precision the run
    trained in, not `auto`."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    called = attention_in_steps(monkeypatch, TrainingStep, "__call__")
    train_here(tmp_path / "out", *TINY, *small_data, "--max_steps", "2", "--mixed_precision", precision)
    assert called == {trained_with}
    assert VaswaniForConditionalGeneration.from_pretrained(tmp_path / "out").config._attn_implementation == "sdpa"
    assert f'"mixed_precision": "{trained_in}"' in (tmp_path / "out" / "README.md").read_text(encoding="utf-8")


def test_a_cpu_run_trains_on_the_cores_it_may_use(tmp_path, small_data, monkeypatch):
    """`accelerate launch` without GPUs sets OMP_NUM_THREADS=1 (one torch thread) in every process, a lone one too:
    the run shares the cores it may use (three here) among its processes (one), as run_trainer.py's twin test."""
    import training.distributed

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(training.distributed, "usable_cores", lambda: 3)
    threads, step = [], TrainingStep.__call__
    monkeypatch.setattr(TrainingStep, "__call__", lambda self, *args: threads.append(torch.get_num_threads()) or step(
        self, *args))
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # as the launcher's OMP_NUM_THREADS=1 (run_training restores the count it finds)
    try:
        train_here(tmp_path / "out", *TINY, *small_data, "--max_steps", "2")
    finally:
        torch.set_num_threads(before)
    assert threads == [3, 3]


@pytest.mark.xdist_group("whole_run")
def test_a_deterministic_run_steps_under_torchs_strict_deterministic_mode_and_trains_as_the_default_run(
        tmp_path, small_data, whole_run, monkeypatch):
    """--deterministic: every step runs with torch's deterministic algorithms in strict mode (an op without a
    deterministic kernel raises), cuBLAS's fixed workspace and inductor's deterministic mode set. On a CPU, where an
    eager run is deterministic without it, the run equals the default one bit for bit: the whole run's losses and
    weights."""
    seen, step = [], TrainingStep.__call__
    strict = lambda: (torch.are_deterministic_algorithms_enabled()
                      and not torch.is_deterministic_algorithms_warn_only_enabled())
    monkeypatch.setattr(TrainingStep, "__call__", lambda self, *args: seen.append(strict()) or step(self, *args))
    monkeypatch.setattr(inductor_config, "deterministic", False)
    workspace = os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
    try:
        train_here(tmp_path / "run", *WHOLE, *small_data, "--deterministic")
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8" and inductor_config.deterministic
    finally:  # the process's settings as they were, for the tests after this one
        torch.use_deterministic_algorithms(False)
        os.environ.pop("CUBLAS_WORKSPACE_CONFIG", None)
        if workspace is not None:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = workspace
    assert len(seen) == len(history(whole_run)) and all(seen) and not strict()
    assert [h["loss"] for h in history(tmp_path / "run")] == [h["loss"] for h in history(whole_run)]
    assert_same_weights(tmp_path / "run", whole_run, atol=0)


@pytest.mark.xdist_group("whole_run")
def test_max_grad_norm_scales_the_gradient_only_above_the_limit(tmp_path, small_data, whole_run):
    """--max_grad_norm: a limit above every step's norm leaves the run bit for bit as without clipping (the paper's
    default); a limit below it changes every step after the first, and each step's norm before clipping is logged."""
    train_here(tmp_path / "loose", *WHOLE, *small_data, "--max_grad_norm", "1e9")
    assert [h["loss"] for h in history(tmp_path / "loose")] == [h["loss"] for h in history(whole_run)]
    assert_same_weights(whole_run, tmp_path / "loose", atol=0)
    train_here(tmp_path / "tight", *WHOLE, *small_data, "--max_grad_norm", "0.1")
    tight, unclipped = history(tmp_path / "tight"), history(whole_run)
    assert all(h["grad_norm"] > 0.1 for h in tight) and "grad_norm" not in unclipped[0]
    assert tight[0]["loss"] == unclipped[0]["loss"]
    assert all(a["loss"] != b["loss"] for a, b in zip(tight[1:], unclipped[1:], strict=True))


@pytest.mark.xdist_group("whole_run")
def test_without_a_time_budget_the_learning_rate_is_the_papers_curve(whole_run):
    """lrate = d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5) (§5.3), with TINY's d_model 32 and 4 warmup
    steps, and no --lr_scale."""
    rates = [h["learning_rate"] for h in history(whole_run)]
    assert rates == pytest.approx([32**-0.5 * min(k**-0.5, k * 4**-1.5) for k in range(1, 9)], rel=1e-9)


def test_dropout_fitted_to_half_way_up_its_ramp_trains_as_that_dropout_and_the_card_says_so(tmp_path, small_data):
    """--dropout 0.1 --dropout_epochs 0 E1, with E1 twice the epochs that --max_steps 4 make: P_drop is fitted to 0.05
    (training/budget.py), and the run is a run with --dropout 0.05, bit for bit; its config and model card say 0.05.
    The epoch, in steps, is counted here from the run's own tokenizer and the §5.1 batches (TINY: 2 batches a step)."""
    flags = [*TINY, *small_data, "--max_steps", "4", "--max_train_minutes", "60"]  # the budget expects max_steps
    train_here(tmp_path / "constant", *flags, "--dropout", "0.05")
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "constant")
    rows = [json.loads(line)["translation"] for line in Path(small_data[1]).read_text(encoding="utf-8").splitlines()]
    sources, targets = encode(tokenizer, [(r["en"], r["de"]) for r in rows])  # none over --max_length 256
    steps_per_epoch = len(token_batches([len(x) for x in sources], [len(x) for x in targets], 400, 3, 0)) // 2
    train_here(tmp_path / "fitted", *flags, "--dropout", "0.1", "--dropout_epochs", "0", repr(8 / steps_per_epoch))
    assert [h["loss"] for h in history(tmp_path / "fitted")] == [h["loss"] for h in history(tmp_path / "constant")]
    assert_same_weights(tmp_path / "fitted", tmp_path / "constant", atol=0)
    assert json.loads((tmp_path / "fitted" / "config.json").read_text(encoding="utf-8"))["dropout"] == 0.05
    card = " ".join((tmp_path / "fitted" / "README.md").read_text(encoding="utf-8").split())
    assert "dropout P_drop = 0.05 and" in card and "P_drop fitted to the epochs" in card


def test_the_parsing_preset_saves_the_papers_parser_decoding(tmp_path, treebank_data):
    """--preset parsing (§6.3) at a tiny size on a toy treebank: the model it saves decodes with a beam of 21, α 0.3
    and outputs up to source length + 300, as generation_config.json and the card say, and is scored with EVALB's
    bracketing F1 as well as BLEU; loaded with a bias against EOS (it never ends), `generate()` runs that far."""
    train_here(tmp_path / "parser", "--preset", "parsing", *TINY, *treebank_data, "--max_steps", "2")
    generation = json.loads((tmp_path / "parser" / "generation_config.json").read_text(encoding="utf-8"))
    assert (generation["num_beams"], generation["gnmt_alpha"], generation["extra_length"]) == (21, 0.3, 300)
    card = " ".join((tmp_path / "parser" / "README.md").read_text(encoding="utf-8").split())
    assert ("beam search with a beam of 21 and the GNMT length penalty ((5 + |Y|) / 6)^α, α = 0.3, up to source "
            "length + 300 tokens") in card and "a tree is at most the source's length + 300 tokens" in card
    assert "- recipe: `extra_length=300` (paper: 50; its parser, §6.3: 300)" in card
    metrics = json.loads((tmp_path / "parser" / "metrics.json").read_text(encoding="utf-8"))
    assert {"bleu", "bracket_f1", "skipped"} <= metrics["test"].keys() <= metrics["validation"].keys()
    assert "bleu_tokenized" not in metrics["test"]  # trees are not read with a language's Moses tokens (Table 2's)
    header = ModelCard.load(tmp_path / "parser" / "README.md").data  # one language: the sentences'
    assert header.language == ["en"] and header.metrics == ["bleu", "chrf", "bracket_f1"]
    assert header.tags[0] == "constituency-parsing" and header.pipeline_tag == "translation"  # the pipeline it has
    assert "Intended use: parsing en sentences of the kind it was trained on (local files (train: train.jsonl;" in card
    assert "Out of scope: sentences of another domain, style or language than its treebank, which it parses" in card
    assert '"Attention Is All You Need", a constituency parser of en (§6.3)' in card and "give the same trees" in card
    assert not any(words in card for words in ("→ tree", "translates", "translation system", "wrong translation"))
    assert ("scored on detokenized text with sacreBLEU and as linearized trees with EVALB (COLLINS.prm)" in card
            and f"| test | bracketing F1 (EVALB) | {metrics['test']['bracket_f1']:.2f} |" in card)
    model = VaswaniForConditionalGeneration.from_pretrained(tmp_path / "parser", add_final_logits_bias=True).eval()
    model.final_logits_bias[0, model.config.eos_token_id] = -1e9
    source = AutoTokenizer.from_pretrained(tmp_path / "parser")(["A dog."], return_tensors="pt")
    assert model.generate(**source).shape[1] == 1 + source["input_ids"].shape[1] + 300


def test_the_output_folder_is_hub_ready_and_push_to_hub_sends_it(tmp_path, small_data, monkeypatch, capfd):
    """--push_to_hub with huggingface_hub's upload captured (tests/upload_capture): the files it would send. The run
    also says how many training pairs --max_length skipped, counted here with the run's tokenizer."""
    import huggingface_hub

    token = "hf_vaswaniTestToken0123456789abcdef"
    recorder = ROOT / "tests" / "upload_capture" / "sitecustomize.py"
    spec = importlib.util.spec_from_file_location("upload_capture", recorder)
    capture = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capture)
    create_repo, upload_folder = capture.recorders(str(tmp_path / "upload.json"))
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)  # the suite's; the two calls are recorded
    train_here(tmp_path / "run", *TINY, *small_data, "--max_steps", "4", "--save_steps", "2", "--average_checkpoints",
               "2", "--push_to_hub", "--hub_model_id", "org/tiny", "--hub_private_repo", "--max_length", "12")
    printed = capfd.readouterr()
    out = tmp_path / "run"
    upload = json.loads((tmp_path / "upload.json").read_text(encoding="utf-8"))
    assert upload["repo_id"] == "org/tiny" and upload["private"] is True
    assert set(upload["files"]) == set(published_files(out)) == CODE_FILES | {
        "model.safetensors", "config.json", "generation_config.json", "pipeline_vaswani.py", "tokenizer.json",
        "tokenizer_config.json", "README.md"}  # what vaswani-push sends: no checkpoint, metrics or log
    assert "pushed to https://huggingface.co/org/tiny" in printed.out + printed.err
    assert token not in printed.out + printed.err
    tokenizer = AutoTokenizer.from_pretrained(out)
    pairs = [json.loads(line)["translation"] for line in Path(small_data[1]).read_text(encoding="utf-8").splitlines()]
    longer = sum(max(len(tokenizer(pair[lang])["input_ids"]) for lang in ("en", "de")) > 12 for pair in pairs)
    assert 0 < longer < len(pairs)
    skipped = f"--max_length 12: {longer:,} of {len(pairs):,} training pairs are longer (in tokens) and skipped"
    assert skipped in printed.out
    assert not any(token.encode() in p.read_bytes() for p in out.rglob("*") if p.is_file())
    names = {p.name for p in out.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "metrics.json",
            "README.md", "modeling_vaswani.py", "configuration_vaswani.py", "gnmt.py"} <= names
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert metrics["averaged_checkpoints"] == ["checkpoint-2", "checkpoint-4"]
    assert metrics["test"]["bleu_signature"].startswith("nrefs:1|case:mixed")
    validation = metrics["validation"]
    assert (f"validation: sacreBLEU {validation['bleu']:.1f}  chrF {validation['chrf']:.1f}  tokenized BLEU "
            f"{validation['bleu_tokenized']:.1f}  perplexity {validation['perplexity']:.2f}\n") in printed.out
    card = (out / "README.md").read_text(encoding="utf-8")
    assert "{{" not in card and f"{metrics['test']['bleu']:.2f}" in card
    generation = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))
    assert generation["num_beams"] == 4 and generation["gnmt_alpha"] == 0.6


@pytest.mark.parametrize("name", ["ddp_multi_gpu", "fsdp_big", "fsdp_two_nodes"])
def test_the_accelerate_configs_are_valid_for_the_pinned_accelerate(name):
    """Read with Accelerate's own schema (unknown keys are refused); the FSDP ones ask for what run.py honours."""
    config = ClusterConfig.from_yaml_file(str(ROOT / "training" / "accelerate_configs" / f"{name}.yaml"))
    assert config.num_processes % config.num_machines == 0
    if config.distributed_type == DistributedType.FSDP:
        assert config.fsdp_config["fsdp_version"] == 2
        assert not set(config.fsdp_config) & {"fsdp_offload_params", "fsdp_activation_checkpointing"}
