"""Misuse of training/run.py, training/run_trainer.py, benchmarks/multi30k.py and vaswani-translate: every wrong flag,
file or folder is one line that names it, before any work is done and before anything is written."""

import errno
import json
import math
import os
import re
import shutil
import subprocess
import sys

import pytest
import torch
from forked import ROOT as REPOSITORY
from forked import accelerate_ranks, free_port, run_forked
from support import refused_translation, run_training, save_marian_folder

import training.data
from training import run_trainer
from training.arguments import check_arguments, parse_arguments
from training.data import load_pairs
from training.fsdp_request import UNSUPPORTED, check_fsdp_request
from vaswani_hf.tools.loading import is_local
from vaswani_hf.tools.text import split_lines
from vaswani_hf.tools.translate import load, translate, translations

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import multi30k

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ["--d_model", "32", "--d_ff", "64", "--num_heads", "4", "--num_layers", "2", "--vocab_size", "300"]


def refused(monkeypatch, *flags) -> str:
    """training/run.py's main() with these flags, in this process (support.run_training): the one-line error it
    exits with."""
    with pytest.raises(SystemExit) as stop:
        run_training(*flags)
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


@pytest.fixture
def data(tmp_path):
    """Aligned text files of 3 pairs."""
    (tmp_path / "p.en").write_text("One.\nTwo.\nThree.\n", encoding="utf-8")
    (tmp_path / "p.de").write_text("Eins.\nZwei.\nDrei.\n", encoding="utf-8")
    return ["--train_file", str(tmp_path / "p")]


@pytest.mark.parametrize(("flags", "named"), [
    (["--logging_steps", "0"], "--logging_steps 0"),
    (["--max_steps", "0"], "--max_steps 0: must be at least 1"),
    (["--tokens_per_step", "0"], "--tokens_per_step 0: must be at least 1"),
    (["--warmup_steps", "0"], "--warmup_steps 0: must be at least 1"),
    (["--eval_max_sentences", "0"], "--eval_max_sentences 0: must be at least 1"),
    (["--average_checkpoints", "0"], "--average_checkpoints 0: must be at least 1"),
    (["--num_beams", "0"], "--num_beams 0: must be at least 1"),
    (["--average_share", "1.5"], "--average_share 1.5: must be between 0 and 1"),
    (["--cooldown_share", "-0.1"], "--cooldown_share -0.1: must be between 0 and 1"),
    (["--label_smoothing", "1.5"], "--label_smoothing 1.5: must be at least 0 and below 1"),
    (["--label_smoothing", "1"], "--label_smoothing 1.0: must be at least 0 and below 1"),  # a uniform target
    (["--seed", "-1"], "--seed -1: must be between 0 and 4294967295"),  # (torch's traceback after the data is read)
    (["--seed", str(2**32)], "--seed 4294967296: must be between 0 and 4294967295"),
    (["--save_steps", "-1"], "--save_steps -1: must be at least 0"),
    (["--save_minutes", "-1"], "--save_minutes -1.0: must be at least 0"),
    (["--evaluations", "-1"], "--evaluations -1: must be at least 0"),
    (["--hub_model_id", " "], "--hub_model_id is blank"),
    (["--bpe_sample", "0"], "--bpe_sample 0"),
    (["--average_checkpoints", "-1"], "--average_checkpoints -1"),
    (["--warmup_share", "1.5"], "--warmup_share 1.5"),
    (["--max_train_minutes", "0"], "--max_train_minutes 0"),
    (["--max_train_minutes", "inf"], "--max_train_minutes inf"),
    (["--lr_scale", "inf"], "--lr_scale inf"),
    (["--mixed_precision", "fp16"], "needs a GPU"),
    (["--mixed_precision", "fp8"], "--mixed_precision fp8"),
    (["--num_heads", "5"], "num_heads"),
    (["--num_decoder_layers", "0"], "num_decoder_layers"),
    (["--max_grad_norm", "-1"], "--max_grad_norm -1"),
    (["--max_grad_norm", "nan"], "--max_grad_norm nan"),
    (["--length_penalty_alpha", "nan"], "--length_penalty_alpha nan"),
    (["--length_penalty_alpha", "inf"], "--length_penalty_alpha inf: must be finite and at least 0"),
    (["--extra_length", "-1"], "--extra_length -1: must be at least 0"),
    (["--attention_dropout", "1.5"], "attention_dropout"),
    (["--alpha_candidates", "0.6", "-1"], "--alpha_candidates"),
    (["--alpha_candidates", "nan"], "--alpha_candidates [nan]"),
    (["--alpha_candidates", "0.6", "inf"], "--alpha_candidates [0.6, inf]: each α must be finite"),
    (["--dropout_epochs", "30", "10"], "--dropout_epochs [30.0, 10.0]"),
    (["--dropout_epochs", "10"], "--dropout_epochs [10.0]"),
    (["--dropout_epochs", "10", "10"], "--dropout_epochs [10.0, 10.0]"),
    (["--dropout_epochs", "-1", "10"], "--dropout_epochs [-1.0, 10.0]"),
    (["--position_embedding", "learned", "--max_length", "2000"], "--max_length 2000"),
    (["--position_embedding", "learned", "--max_length", "1025"], "--max_length 1025: learned positions stop at 1024"),
    (["--preset", "cpu-tiny"], "--preset cpu-tiny"),
    (["--streaming"], "--streaming needs --bpe_sample"),
    (["--streaming", "--bpe_sample", "100", "--dropout_epochs", "0", "1"], "--dropout_epochs counts epochs"),
    (["--shuffle_buffer", "0"], "--shuffle_buffer 0"),
    (["--max_tokens", "-1"], "--max_tokens -1"),
    (["--pad_to_multiple_of", "0"], "--pad_to_multiple_of 0"),
    (["--report_to", "tensorbord"], "--report_to tensorbord: one of aim, comet_ml, mlflow, tensorboard, wandb,"),
    (["--report_to", "none", "tensorboard"], "--report_to none tensorboard: none stands alone"),
    (["--compile", "inducer"], "--compile inducer"),
    (["--compile", "inductor", "--dropout_epochs", "0", "1"], "add --compile no"),
    (["--train_file", ""], "--train_file is blank"),  # an unset variable: not the embedded data
    (["--dataset_name", " "], "--dataset_name is blank"),
    (["--dataset_config_name", ""], "--dataset_config_name is blank"),
    (["--dataset_name", "org/news"], "--dataset_name and --train_file: a dataset brings its own splits"),  # not read
    (["--dataset_config_name", "de-en"], "--dataset_config_name de-en names a configuration of --dataset_name"),
    (["--resume_from_checkpoint", ""], "--resume_from_checkpoint is blank"),  # not a fresh run
    (["--source_lang", "de", "--target_lang", "de"], "--source_lang and --target_lang are both de: name the data's"),
    (["--lenght_penalty_alpha", "1"],  # not HfArgumentParser's traceback
     "--lenght_penalty_alpha is not a flag of training/run.py (did you mean --length_penalty_alpha?); --help lists"),
    (["--lenght_penalty_alpha=0.600000000000"], "(did you mean --length_penalty_alpha?)"),  # flag=value
    (["stray"], "error: stray is not a flag of training/run.py; --help lists them"),
])
def test_a_wrong_flag_is_one_line_before_anything_is_written(tmp_path, monkeypatch, data, flags, named):
    if "fp16" in flags and torch.cuda.is_available():
        pytest.skip("fp16 is refused only where there is no GPU")
    out = tmp_path / "out"
    assert named in refused(monkeypatch, *TINY, *data, "--output_dir", str(out), "--max_steps", "1", *flags)
    assert not out.exists()


@pytest.mark.parametrize("split", ["validation", "test"])
def test_a_dataset_and_a_file_of_any_split_are_refused(tmp_path, monkeypatch, data, split):
    """The dataset's splits would be read and the file dropped."""
    out = tmp_path / "out"
    flags = ["--dataset_name", "org/news", f"--{split}_file", data[1], "--output_dir", str(out), "--max_steps", "1"]
    assert f"--dataset_name and --{split}_file: a dataset brings its own splits" in refused(monkeypatch, *TINY, *flags)
    assert not out.exists()


def test_a_tracker_whose_package_is_not_installed_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                                        data):
    """Accelerate warns of it and trains without it: a run of hours would keep no record of its losses."""
    from accelerate import tracking

    monkeypatch.setattr(tracking, "get_available_trackers", lambda: [tracking.LoggerType.TENSORBOARD])
    out = tmp_path / "out"
    flags = ["--output_dir", str(out), "--max_steps", "1", "--report_to", "tensorboard", "wandb"]
    assert "error: --report_to wandb: its package is not installed (pip install wandb)" in refused(
        monkeypatch, *TINY, *data, *flags)
    assert not out.exists()


@pytest.mark.parametrize(("start", "flags", "named"), [
    ("trained", ["--d_model", "64"], "error: --d_model is a new model's: with --model_name_or_path, the config and"),
    ("trained", ["--num_heads=2"], "error: --num_heads is a new model's: with --model_name_or_path, the config"),
    ("trained", ["--preset", "cpu-small"], "error: --preset is a new model's: with --model_name_or_path, the config"),
    ("trained", ["--bpe_sample", "10"], "error: --bpe_sample is a new model's: with --model_name_or_path, the"),
    ("marian", [], "holds a 'marian' model, not a vaswani_hf one"),
    ("64 learned positions", ["--max_length", "65"], "error: --max_length 65: the learned positions of "),
])
def test_fine_tuning_refuses_a_new_models_flags_and_a_model_it_cannot_train_in_one_line(
        tmp_path, monkeypatch, data, translation_folder, start, flags, named):
    """run.py --model_name_or_path, before anything is written: a new model's flags (a preset's, the BPE's sample), a
    model of another kind, positions shorter than --max_length."""
    folder = translation_folder
    if start == "marian":
        save_marian_folder(folder := tmp_path / "marian")
    elif start != "trained":
        shutil.copytree(translation_folder, folder := tmp_path / "start")
        learned = {"position_embedding": "learned", "max_position_embeddings": 64}
        config = json.loads((folder / "config.json").read_bytes()) | learned
        (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    out = tmp_path / "out"
    start = ["--model_name_or_path", folder, "--output_dir", out, "--max_steps", "1"]
    assert named in refused(monkeypatch, *data, *start, *flags)
    assert not out.exists()


def test_a_streamed_fine_tuning_is_not_asked_for_the_bpe_sample_it_refuses(monkeypatch):
    """--streaming needs --bpe_sample for a new model's BPE; a fine-tuning run has its start's tokenizer."""
    check_arguments(*parse_arguments(["--streaming", "--model_name_or_path", "any", "--no_fast_cpu"]), gpu=False)
    with pytest.raises(SystemExit, match="^error: --streaming needs --bpe_sample N"):
        check_arguments(*parse_arguments(["--streaming", "--no_fast_cpu"]), gpu=False)


@pytest.mark.parametrize(("precision", "capabilities", "warned"), [
    ("bf16", {"avx2": True}, True),  # as the AMD EPYC of family 23 reports
    ("bf16", {"avx2": True, "avx512_bf16": True}, False),
    ("bf16", {"amx_bf16": True}, False),
    ("bf16", {"bf16": True}, False),  # an Arm CPU's name for it
    ("no", {"avx2": True}, False),
])
def test_bf16_on_a_cpu_without_bfloat16_instructions_is_warned_of_at_the_start(tmp_path, monkeypatch, capsys, data,
                                                                              precision, capabilities, warned):
    """bfloat16 autocast took 10x float32's step on such a CPU (benchmarks/README.md): the run says so as it starts.
    This one is then refused for its output folder, so nothing but the start runs."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's\n", encoding="utf-8")
    assert "--overwrite_output_dir" in refused(monkeypatch, *TINY, *data, "--output_dir", str(out),
                                               "--mixed_precision", precision)
    printed = capsys.readouterr().out
    assert ("warning: --mixed_precision bf16 on a CPU without bfloat16 instructions" in printed) == warned


@pytest.mark.parametrize(("launcher", "flag", "chosen"), [
    ("bf16", [], "bf16"), ("no", [], "no"), ("bf16", ["--mixed_precision", "no"], "no"), (None, [], "no")])
def test_mixed_precision_auto_is_what_accelerate_launch_names(tmp_path, monkeypatch, capsys, data, launcher, flag,
                                                              chosen):
    """`accelerate launch --mixed_precision bf16 training/run.py` (the launcher's flag, or `accelerate config`'s)
    trained a CPU run in float32: run.py's `auto` overrode it. `auto` is now the launcher's bf16 or fp16 where it names
    one (its default, no, names neither); run.py's own flag wins. The run is then refused for its output folder."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    if launcher is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's\n", encoding="utf-8")
    assert "--overwrite_output_dir" in refused(monkeypatch, *TINY, *data, "--output_dir", str(out), *flag)
    assert f"mixed_precision {chosen}\n" in capsys.readouterr().out


@pytest.mark.parametrize(("backend", "flags", "named"), [
    ("AOT_EAGER", ["--dropout_epochs", "1", "2"], ("add --compile no (accelerate launch --dynamo_backend aot_eager "
                                                   "compiles it)")),
    ("IPEX", [], "error: accelerate launch --dynamo_backend ipex: auto, no, or one of")])
def test_a_compile_asked_of_accelerate_launch_is_checked_as_run_pys_own(monkeypatch, data, backend, flags, named):
    """The launcher's --dynamo_backend compiles the run's step as --compile does: refused where --compile would be."""
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", backend)
    assert named in refused(monkeypatch, *TINY, *data, *flags)


def test_deepspeed_asked_of_accelerate_launch_is_refused(tmp_path, data):
    """`accelerate launch --use_deepspeed` (where deepspeed is installed: the launcher needs it), as the launched
    script sees it: refused as run.py starts, before torch loads, as the FSDP requests it cannot honour are."""
    result = subprocess.run([sys.executable, str(REPOSITORY / "training" / "run.py"), *TINY, *data, "--output_dir",
                             str(tmp_path / "run")], env={**os.environ, "ACCELERATE_USE_DEEPSPEED": "true"},
                            capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 1 and result.stderr.splitlines()[-1] == (
        "error: DeepSpeed was asked for; training/run.py shards with FSDP2 (--use_fsdp --fsdp_version 2) or runs DDP: "
        "launch without --use_deepspeed")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("environment", "said"), [
    ({"ACCELERATE_USE_DEEPSPEED": "True"}, "error: DeepSpeed was asked for"),
    ({}, "error: FSDP version 1 was asked for"),  # Accelerate's default version
    ({"FSDP_VERSION": "2"}, "error: FSDP with one process shards nothing"),  # one process unless WORLD_SIZE says
    ({"FSDP_VERSION": "2", "WORLD_SIZE": "2", "FSDP_ACTIVATION_CHECKPOINTING": "True"},
     "error: FSDP activation checkpointing (FSDP_ACTIVATION_CHECKPOINTING) is not supported by training/run.py"),
    ({"FSDP_VERSION": "2", "WORLD_SIZE": "2", "FSDP_OFFLOAD_PARAMS": "True"}, "error: FSDP parameter offloading"),
    ({"FSDP_VERSION": "2", "WORLD_SIZE": "2", "FSDP_OFFLOAD_PARAMS": "false"}, None),
])
def test_each_launch_request_run_py_cannot_honour_is_named(monkeypatch, environment, said):
    """What `accelerate launch --use_fsdp` (ACCELERATE_USE_FSDP, true in any case) and its FSDP settings ask, read
    from the environment as the launcher and `accelerate config` write it."""
    for variable in ("ACCELERATE_USE_DEEPSPEED", "FSDP_VERSION", "WORLD_SIZE", "RANK", *UNSUPPORTED):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "TRUE")
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    if said is None:
        check_fsdp_request()
    else:
        with pytest.raises(SystemExit) as stop:
            check_fsdp_request()
        assert stop.value.code.startswith(said)


def test_fp16_asked_of_accelerate_launch_on_a_cpu_is_refused(monkeypatch, data):
    """As run.py's own --mixed_precision fp16 there: Accelerate would train in float32."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    assert refused(monkeypatch, *TINY, *data).startswith("error: accelerate launch --mixed_precision fp16 needs a GPU")


def test_a_precision_asked_of_accelerate_launch_that_run_py_has_not_is_refused(monkeypatch, data):
    """fp8 (Accelerate's, with Transformer Engine or torchao on a GPU): `auto` trained in bf16 without a word."""
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp8")
    assert refused(monkeypatch, *TINY, *data) == (
        "error: accelerate launch --mixed_precision fp8: run.py trains in no (float32), bf16 or fp16")


def test_run_trainer_refuses_fp16_asked_of_accelerate_launch_on_a_cpu(monkeypatch):
    """The Trainer takes the launcher's --mixed_precision: fp16 so asked on a CPU would train float32 as --fp16."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "fp16")
    with pytest.raises(SystemExit, match="^error: accelerate launch --mixed_precision fp16 needs a GPU"):
        run_trainer.parse_arguments(["--preset", "cpu-small", "--output_dir", "unused"])


def test_run_trainer_refuses_fp16_wherever_it_would_train_on_the_cpu(monkeypatch):
    """`--use_cpu false` on a machine without a GPU trains on the CPU all the same: --fp16 is refused there too."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit, match="^error: --fp16 needs a GPU"):
        run_trainer.parse_arguments(["--preset", "cpu-small", "--output_dir", "unused", "--fp16", "true",
                                     "--use_cpu", "false"])


@pytest.mark.parametrize(("flags", "launcher", "capabilities", "warned"), [
    (["--bf16", "true"], "no", {"avx2": True}, "--bf16"), (["--bf16", "true"], "no", {"avx512_bf16": True}, None),
    (["--bf16", "false"], "no", {"avx2": True}, None),
    ([], "bf16", {"avx2": True}, "accelerate launch --mixed_precision bf16")])  # the Trainer takes the launcher's
def test_run_trainer_warns_of_bf16_on_a_cpu_without_bfloat16_instructions(tmp_path, monkeypatch, capsys, flags,
                                                                         launcher, capabilities, warned):
    """As run.py (the test above): said before its output folder, someone else's, is refused."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("someone else's\n", encoding="utf-8")
    with pytest.raises(SystemExit, match="is not empty"):
        run_trainer.main(["--preset", "cpu-small", "--output_dir", str(out), *flags])
    printed = capsys.readouterr().out
    assert ("on a CPU without bfloat16 instructions" in printed) == (warned is not None)
    assert warned is None or f"warning: {warned} on a CPU without bfloat16 instructions" in printed


@pytest.mark.parametrize(("flags", "named"), [
    (["--seed", "-1"], "error: --seed -1: must be between 0 and 4294967295"),  # (set_seed's traceback after the data)
    (["--label_smoothing_factor", "1"], "error: --label_smoothing_factor 1.0: must be at least 0 and below 1"),
    (["--label_smoothing_factor", "-0.1"], "error: --label_smoothing_factor -0.1: must be at least 0 and below 1"),
    # the Trainer's own, taken by it and failed on later: a DataLoader's, a division's, a generation's traceback
    (["--per_device_train_batch_size", "0"], "error: --per_device_train_batch_size 0: must be at least 1"),
    (["--per_device_eval_batch_size", "0"], "error: --per_device_eval_batch_size 0: must be at least 1"),
    (["--gradient_accumulation_steps", "0"], "error: --gradient_accumulation_steps 0: must be at least 1"),
    (["--generation_max_length", "1"], "error: --generation_max_length 1: must be at least 2"),  # after training
    (["--save_steps", "-5"], "error: --save_steps -5.0: must be positive and finite"),
    (["--eval_steps", "-1"], "error: --eval_steps -1.0: must be positive and finite"),  # 0: --logging_steps
    (["--logging_steps", "0"], "error: logging strategy IntervalStrategy.STEPS requires non-zero --logging_steps")])
def test_run_trainer_refuses_flags_that_would_fail_later_in_one_line(flags, named):
    """A seed torch does not take, a label smoothing of 1 or more (a uniform target), and the Trainer's arguments
    that it takes and fails on later (a traceback; --generation_max_length 1 after the training)."""
    with pytest.raises(SystemExit) as stop:
        run_trainer.parse_arguments(["--preset", "cpu-small", "--output_dir", "unused", *flags])
    assert stop.value.code == named


def test_run_trainer_reads_a_steps_flag_only_where_its_strategy_counts_steps():
    """--save_steps 0 under --save_strategy epoch, --eval_steps -1 under --eval_strategy no: flags the Trainer does
    not read, not refused."""
    flags = ["--save_strategy", "epoch", "--save_steps", "0", "--eval_strategy", "no", "--eval_steps", "-1"]
    *_, training_args = run_trainer.parse_arguments(["--preset", "cpu-small", "--output_dir", "unused", *flags])
    assert (training_args.save_strategy, training_args.eval_strategy) == ("epoch", "no")


def test_run_trainer_takes_the_example_scripts_flags_that_ask_for_what_it_does():
    *_, training_args = run_trainer.parse_arguments(["--preset", "cpu-small", "--output_dir", "unused", "--do_train",
                                                     "--do_eval", "--do_predict"])
    assert training_args.do_train and training_args.do_eval and training_args.do_predict
    *_, training_args = run_trainer.parse_arguments(["--preset", "cpu-small", "--output_dir", "unused",
                                                     "--hub_strategy", "end"])  # what the run does
    assert training_args.hub_strategy == "end"


def test_run_trainer_refuses_an_unknown_preset_in_one_line():
    with pytest.raises(SystemExit) as stop:
        run_trainer.parse_arguments(["--preset", "cpu-tiny", "--output_dir", "unused"])
    message = str(stop.value.code)
    assert message.startswith("error: --preset cpu-tiny") and "cpu-medium" in message and "\n" not in message


@pytest.mark.parametrize(("flags", "named"), [
    (["--num_heads", "5"], "error: VaswaniConfig: d_model=128 is not divisible by num_heads=5"),
    (["--vocab_size", "3"], "error: --vocab_size 3: must be at least 8"),
    (["--max_source_length", "0"], "error: --max_source_length 0: must be at least 1"),
    (["--extra_length", "-1"], "error: --extra_length -1: must be at least 0"),
    (["--generation_num_beams", "0"], "error: --generation_num_beams 0: must be at least 1"),  # not the paper's 4
    (["--length_penalty_alpha", "inf"], "error: --length_penalty_alpha inf: must be finite and at least 0"),
    (["--lr_scale", "-1"], "error: --lr_scale -1.0: must be positive and finite"),
    (["--warmup_steps", "0"], "error: --warmup_steps 0: the §5.3 peak learning rate needs at least 1 step"),
    (["--learning_rate", "nan"], "error: --learning_rate nan: must be positive and finite"),
    (["--validation_file", ""], "error: --validation_file is blank: give one, or leave the flag out"),
    (["--resume_from_checkpoint", " "], "error: --resume_from_checkpoint is blank: give one, or leave the flag out"),
    (["--num_beams", "1"],  # run.py's; here the Trainer's, whose name ends with it (not --num_heads, the nearest)
     "error: --num_beams is not a flag of training/run_trainer.py (did you mean --generation_num_beams?)"),
    (["--overwrite_output_dir"],  # run.py's flag; transformers 5's Trainer has none
     "error: --overwrite_output_dir is not a flag of training/run_trainer.py; --help lists them"),
    (["--streaming", "--bpe_sample", "10"],  # run.py's data flags that this run would ignore
     "error: --streaming is training/run.py's (here the Trainer's datasets hold the training pairs in memory)"),
    (["--max_length=100"], "error: --max_length is training/run.py's (it skips longer pairs; here pairs are"),
    (["--shuffle_buffer", "10"], "error: --shuffle_buffer is training/run.py's (it orders a --streaming run)"),
    (["--hub_token", "hf_x"],  # the Trainer's Hub flags, which the run's one push at its end would not honour
     "error: --hub_token: the token is huggingface_hub's own: set HF_TOKEN, or hf auth login"),
    (["--hub_strategy", "checkpoint"], "error: --hub_strategy: the run pushes its finished model's files once, at"),
    (["--hub_revision=dev"], "error: --hub_revision: the run pushes to the repository's main branch"),
    (["--generation_config", "outputs/run"],  # the Trainer's: it took the run's decoding's place, then crashed
     "error: --generation_config: the run decodes (and saves in its generation_config.json) as --generation_num"),
    (["--do_eval", "--do_predict"],  # transformers' example scripts' flags: an evaluation alone is not this script's
     "error: --do_eval, --do_predict: training/run_trainer.py always trains, then tests: to score a model, translate"),
    (["--do_train", "false"], "error: --do_train false: training/run_trainer.py always trains, then tests: "),
    (["--fp16", "true", "--use_cpu", "true"],  # Accelerate leaves autocast off there: the run would be float32
     "error: --fp16 needs a GPU (float16 autocast is not run on the CPU): leave it out (float32) or use --bf16"),
])
def test_run_trainer_refuses_a_wrong_flag_in_one_line_before_any_work(flags, named):
    """parse_arguments, the first thing run_trainer.main does: before the data is read and the BPE trained."""
    with pytest.raises(SystemExit) as stop:
        run_trainer.parse_arguments(["--preset", "cpu-small", "--output_dir", "unused", *flags])
    message = str(stop.value.code)
    assert message.startswith(named) and "\n" not in message


@pytest.mark.parametrize(("flags", "named"), [
    (["--preset", "cpu-tiny"], "--preset cpu-tiny"),
    (["--minutes", "0"], "--minutes"),
    (["--minutes", "-5"], "--minutes"),
    (["--minutes", "nan"], "--minutes"),
    (["--peer_minutes", "0"], "--peer_minutes"),
])
def test_the_side_by_side_refuses_a_wrong_flag_in_one_line_before_any_folder_or_run(tmp_path, monkeypatch, capsys,
                                                                                   flags, named):
    for split in ("train", "valid", "test2016"):
        (tmp_path / f"{split}.en").write_text("One.\n", encoding="utf-8")
    started = []
    monkeypatch.setattr(multi30k, "run", lambda command, log: started.append(command))
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "argv", ["multi30k.py", "--data", str(tmp_path), "--skip_peer", "--output_dir", str(out),
                                      *flags])
    with pytest.raises(SystemExit) as stop:
        multi30k.main()
    # argparse prints its error (after the usage) and exits 2; the script's own checks exit with the line itself
    message = stop.value.code if isinstance(stop.value.code, str) else capsys.readouterr().err.strip().splitlines()[-1]
    assert named in message and "\n" not in message, message
    assert not out.exists() and not started


def test_missing_misaligned_and_non_utf8_data_are_one_line_errors(tmp_path, monkeypatch, data):
    out = tmp_path / "out"
    missing = tmp_path / "no-such"
    assert "no-such" in refused(monkeypatch, *TINY, "--train_file", str(missing), "--output_dir", str(out))
    (tmp_path / "q.en").write_text("One.\nTwo.\n", encoding="utf-8")
    (tmp_path / "q.de").write_text("Eins.\n", encoding="utf-8")
    assert "2 en lines but 1 de lines" in refused(monkeypatch, *TINY, "--train_file", str(tmp_path / "q"),
                                                  "--output_dir", str(out))
    (tmp_path / "r.en").write_bytes("Café.\n".encode("latin-1"))
    (tmp_path / "r.de").write_text("Kaffee.\n", encoding="utf-8")
    message = refused(monkeypatch, *TINY, "--train_file", str(tmp_path / "r"), "--output_dir", str(out))
    assert "r.en is not UTF-8" in message and "line 1" in message
    (tmp_path / "e.en").write_text("", encoding="utf-8")
    (tmp_path / "e.de").write_text("", encoding="utf-8")
    message = refused(monkeypatch, *TINY, *data, "--validation_file", str(tmp_path / "e"), "--output_dir", str(out))
    assert message == f"error: the validation split has no pairs ({tmp_path / 'e'})"
    assert refused(monkeypatch, *TINY, "--validation_file", data[1], "--output_dir", str(out)) == (
        "error: no training data: give --dataset_name or --train_file (or neither, for the embedded data)")
    assert not (out / "tokenizer.json").exists()


def test_a_bad_line_of_a_streamed_file_is_one_line_where_it_is_read(tmp_path):
    """--streaming reads a file as training goes: a misaligned or non-UTF-8 line is found where it is read (here
    inside the first step, the BPE having learned from the first pair), and the run stops with one line."""
    from training.data import DataError, load_splits

    (tmp_path / "q.en").write_text("One.\nTwo.\nThree.\n", encoding="utf-8")
    (tmp_path / "q.de").write_text("Eins.\nZwei.\n", encoding="utf-8")
    (tmp_path / "r.en").write_bytes("One.\nCafé.\n".encode("latin-1"))
    (tmp_path / "r.de").write_text("Eins.\nKaffee.\n", encoding="utf-8")
    stream = load_splits("en", "de", files={"train": str(tmp_path / "r")}, streaming=True)["train"]
    with pytest.raises(DataError, match="r.en is not UTF-8 text: byte 0xe9 on line 2"):
        list(stream)
    result = run_forked([*TINY, "--train_file", str(tmp_path / "q"), "--streaming", "--bpe_sample", "1",
                         "--output_dir", str(tmp_path / "out")], [{}], timeout=600)  # a process of its own
    assert result.returncode == 1 and result.stderr.splitlines()[-1] == "error: --train_file " + str(
        tmp_path / "q") + ": 3 en lines but 2 de lines", result.stderr[-2000:]
    assert "Traceback" not in result.stderr


def test_a_folder_holding_anything_is_refused_unless_resumed_or_overwritten(tmp_path, monkeypatch, data):
    """--overwrite_output_dir deletes what a run wrote, and nothing else: not a folder holding someone's notes, not
    the current folder (which a blank --output_dir would be)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "tokenizer.json").write_text("{}", encoding="utf-8")  # a run stopped before its first checkpoint
    assert refused(monkeypatch, *TINY, *data, "--output_dir", str(out)) == (
        f"error: --output_dir {out} is not empty and holds no checkpoint to resume: replace it with "
        "--overwrite_output_dir, or choose another folder")  # a folder with a checkpoint: test_training_run.py
    (out / "notes.txt").write_text("mine", encoding="utf-8")
    for overwrite in ([], ["--overwrite_output_dir"]):
        assert refused(monkeypatch, *TINY, *data, "--output_dir", str(out), *overwrite) == (
            f"error: --output_dir {out} holds notes.txt, which no run writes: choose another folder "
            "(--overwrite_output_dir deletes only a run's)")
    assert "give one" in refused(monkeypatch, *TINY, *data, "--output_dir", str(out), "--overwrite_output_dir",
                                 "--resume_from_checkpoint", "latest")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "tokenizer.json"]  # nothing written or deleted
    monkeypatch.chdir(out)
    for resume in ([], ["--resume_from_checkpoint", "latest"]):
        assert refused(monkeypatch, *TINY, *data, "--output_dir", "", "--overwrite_output_dir", *resume) == (
            "error: --output_dir is blank: give a folder")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt", "tokenizer.json"]
    file = tmp_path / "file"
    file.write_text("", encoding="utf-8")
    for inside in (file, file / "run"):
        assert refused(monkeypatch, *TINY, *data, "--output_dir", str(inside)) == (
            f"error: --output_dir {inside}: {file} is a file")
    with pytest.raises(SystemExit, match=f"^error: --output_dir {file / 'run'}: {file} is a file$"):
        run_trainer.main([*TINY, *data, "--output_dir", str(file / "run")])
    with pytest.raises(SystemExit, match="^error: --output_dir is blank: give a folder$"):
        run_trainer.main([*TINY, *data, "--output_dir", ""])
    monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))  # a folder not ours
    assert refused(monkeypatch, *TINY, *data, "--output_dir", str(tmp_path / "new" / "run")) == (
        f"error: --output_dir {tmp_path / 'new' / 'run'}: {tmp_path} is not writable")


def test_overwriting_takes_every_name_a_run_writes_and_no_name_that_only_begins_like_one(tmp_path):
    """check_output_dir on a folder holding each kind of entry a run leaves (checkpoints being written or moved out of
    the run, the tokens, TensorBoard's logs, the model folder's files, sharded weights): --overwrite_output_dir may
    take it. A name that only begins or ends like one of them is someone else's: refused."""
    from types import SimpleNamespace

    from training.run import check_output_dir

    out = tmp_path / "out"
    out.mkdir()
    for folder in ("checkpoint-12", ".incomplete-checkpoint-14", "abandoned-checkpoint-10", "tokens", "tokens.partial",
                   "vaswani"):
        (out / folder).mkdir()
    for file in ("README.md", "config.json", "generation_config.json", "metrics.json", "schedule.json",
                 "tokenizer.json", "tokenizer_config.json", "model-00001-of-00002.safetensors",
                 "model-00002-of-00002.safetensors", "model.safetensors.index.json", "modeling_vaswani.py"):
        (out / file).write_text("", encoding="utf-8")
    args = SimpleNamespace(output_dir=str(out), resume_from_checkpoint=None, overwrite_output_dir=True)
    assert check_output_dir(out, args, {}, print) is None
    for foreign in ("checkpoint-12.bak", "old-checkpoint-3", "README.md~", "model.safetensors.tmp", "my-tokens"):
        (out / foreign).write_text("", encoding="utf-8")
        with pytest.raises(SystemExit, match=f"^error: --output_dir {out} holds {re.escape(foreign)}, which no run"):
            check_output_dir(out, args, {}, print)
        (out / foreign).unlink()


def test_too_little_data_for_one_step_is_one_line_and_the_folder_it_leaves_is_refused_with_what_to_do(
        tmp_path, monkeypatch, data):
    """The batches are known once the tokenizer has been trained and written: the run names them and the flag, and
    the same command again is told to overwrite the folder (it holds no checkpoint to resume). Where --max_length
    left every pair out, it names that flag alone (some left out: tests/test_data.py)."""
    out, flags = tmp_path / "out", [*TINY, *data, "--max_tokens", "16", "--no_fast_cpu"]
    assert refused(monkeypatch, *flags, "--output_dir", str(out), "--tokens_per_step", "100") == (
        "error: the training data makes 1 batch(es) of at most 16 tokens, fewer than the 7 of one optimizer step: "
        "lower --tokens_per_step")
    assert "holds no checkpoint to resume: replace it with --overwrite_output_dir" in refused(
        monkeypatch, *flags, "--output_dir", str(out), "--tokens_per_step", "16")
    message = refused(monkeypatch, *flags, "--output_dir", str(tmp_path / "short"), "--max_length", "1")
    assert message == "error: every training pair (3) is over --max_length 1 on a side: raise --max_length"


def test_resuming_where_there_is_nothing_to_resume_is_refused_before_any_work(tmp_path, monkeypatch, data):
    out = tmp_path / "out"
    assert "no intact checkpoint" in refused(monkeypatch, *TINY, *data, "--output_dir", str(out),
                                             "--resume_from_checkpoint", "latest")
    assert not out.exists()  # no tokenizer trained into it first


def test_resuming_a_streamed_run_without_streaming_or_the_reverse_is_refused_before_any_work(tmp_path, monkeypatch,
                                                                                               data):
    """A streamed run's checkpoint keeps each process's place in the stream, an epoch run's its step in the epochs:
    resumed the other way, the run would stop in a KeyError after loading its data, or go on through other batches
    than its own. One line names the flag to resume with."""
    flags = [*TINY, *data, "--tokens_per_step", "2", "--max_tokens", "2", "--eval_steps", "0", "--save_steps", "1"]
    streaming = ["--streaming", "--bpe_sample", "3"]
    for run, first, then, said in (("epochs", [], streaming, "was not streamed: resume it without --streaming"),
                                   ("stream", streaming, [], "was streamed: resume it with --streaming")):
        out = tmp_path / run
        run_training(*flags, *first, "--output_dir", out, "--max_steps", "1")
        assert refused(monkeypatch, *flags, *then, "--output_dir", str(out), "--max_steps", "2",
                       "--resume_from_checkpoint", "latest") == f"error: {out / 'checkpoint-1'} {said}"


def test_resuming_with_another_number_of_processes_is_refused_in_one_line(tmp_path, data):
    """A checkpoint keeps each process's random generators and the step's batches are shared among the processes:
    resumed by another number of them, the run stops in one line, said once, before any work (not a traceback as a
    process finds no generators of its own)."""
    out = tmp_path / "out"
    flags = [*TINY, *data, "--output_dir", out, "--tokens_per_step", "2", "--max_tokens", "2", "--eval_steps", "0",
             "--save_steps", "1"]
    run_training(*flags, "--max_steps", "1")
    ranks = accelerate_ranks(2, "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no", port=free_port())
    result = run_forked([*flags, "--max_steps", "2", "--resume_from_checkpoint", "latest"], ranks, timeout=300,
                        script=REPOSITORY / "training" / "run.py")
    said = [line for line in result.stderr.splitlines() if line.startswith("error")]
    expected = (f"error: {out / 'checkpoint-1'} was written by 1 process, this launch has 2: resume it with 1 "
                "(accelerate launch --num_processes 1)")
    assert result.returncode == 1 and said == [expected], result.stderr[-2000:]


def test_a_schedule_to_replay_that_cannot_be_is_refused_before_any_work(tmp_path, monkeypatch, data):
    out = tmp_path / "out"
    assert "--max_train_minutes too" in refused(monkeypatch, *TINY, *data, "--output_dir", str(out),
                                                "--replay_schedule", str(tmp_path / "schedule.json"))
    budgeted = [*TINY, *data, "--output_dir", str(out), "--max_train_minutes", "1", "--replay_schedule"]
    assert "not a run's schedule.json" in refused(monkeypatch, *budgeted, str(tmp_path / "schedule.json"))
    (tmp_path / "schedule.json").write_text(json.dumps({"steps": 3, "expected_steps": [9.0], "checkpoints": [],
                                                        "evaluations": []}), encoding="utf-8")
    assert "do not agree" in refused(monkeypatch, *budgeted, str(tmp_path / "schedule.json"))
    for listed in ("checkpoints", "evaluations"):  # steps, not a number of them
        (tmp_path / "schedule.json").write_text(json.dumps({"steps": 1, "expected_steps": [9.0], "checkpoints": [],
                                                            "evaluations": [], listed: 1}), encoding="utf-8")
        assert "do not agree" in refused(monkeypatch, *budgeted, str(tmp_path / "schedule.json"))
    assert not out.exists()


def test_a_cache_that_cannot_be_written_is_one_line_before_any_work(tmp_path, monkeypatch, capfd, data,
                                                                    translation_folder):
    """run.py on a CPU, vaswani-translate with either engine and `fast_cpu(model)` keep what they measure or convert in
    $VASWANI_HF_CACHE: a folder there that cannot be made is named in one line, with the way out, before any timing,
    conversion or training. (A path under a file: root, who runs CI, can write where permissions say no.)"""
    from vaswani_hf import fast_cpu
    from vaswani_hf.speed import fast_cpu as fast_cpu_module
    from vaswani_hf.speed.kernels import CacheNotWritable

    (tmp_path / "file").write_text("", encoding="utf-8")
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "file" / "cache"))
    monkeypatch.setattr(fast_cpu_module, "measured_plan", lambda *args: pytest.fail("timed a plan it cannot keep"))
    out = tmp_path / "out"
    message = refused(monkeypatch, *TINY, *data, "--output_dir", str(out))
    assert message.startswith(f"error: vaswani_hf cannot write its cache {tmp_path / 'file' / 'cache' / 'fast_cpu'} ")
    assert message.endswith("set VASWANI_HF_CACHE to a folder it can write, or give --no_fast_cpu")
    assert not out.exists()
    resumed = parse_arguments([*TINY, *data, "--output_dir", str(out), "--resume_from_checkpoint", "latest"])
    check_arguments(*resumed, gpu=False)  # a resumed run's checkpoints hold its plan: the cache is not needed
    for engine in ("torch", "ctranslate2"):
        message = refused_translation(capfd, monkeypatch, "--model", translation_folder, "--engine", engine,
                                      stdin=b"A dog runs.\n")
        kind = "fast_cpu" if engine == "torch" else "ctranslate2"
        assert message.startswith(f"error: vaswani_hf cannot write its cache {tmp_path / 'file' / 'cache' / kind} ")
    with pytest.raises(CacheNotWritable, match="^vaswani_hf cannot write its cache .*VASWANI_HF_CACHE"):
        fast_cpu(load(str(translation_folder), device="cpu", fast=False)[0])


def test_a_push_that_could_not_happen_is_one_line_before_any_work(tmp_path, monkeypatch, data):
    """--push_to_hub offline, without a token, or to a name the Hub refuses (the output folder's, by default):
    training/run.py and run_trainer.py say so at the start, not after the training."""
    import huggingface_hub

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda *a, **kw: pytest.fail("nothing is created"))
    out = tmp_path / "out"
    push = [*TINY, *data, "--output_dir", str(out), "--push_to_hub", "--hub_model_id", "org/name"]
    monkeypatch.setenv("HF_TOKEN", "hf_vaswaniTestToken0123456789abcdef")
    assert "HF_HUB_OFFLINE is set" in refused(monkeypatch, *push)  # the suite runs offline
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_TOKEN")
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: None)  # nor a token file
    assert refused(monkeypatch, *push) == ("error: --push_to_hub needs a Hugging Face token: hf auth login, or set "
                                           "HF_TOKEN")
    with pytest.raises(SystemExit, match="^error: --push_to_hub needs a Hugging Face token"):
        run_trainer.main([*TINY, *data, "--output_dir", str(out), "--push_to_hub", "--max_steps", "1"])
    monkeypatch.setattr(huggingface_hub, "get_token", lambda: "hf_vaswaniTestToken0123456789abcdef")
    assert refused(monkeypatch, *push[:-1], "my model").startswith(
        "error: --push_to_hub to 'my model': Repo id must use alphanumeric chars")
    assert refused(monkeypatch, *TINY, *data, "--output_dir", str(tmp_path / "my run"), "--push_to_hub").startswith(
        "error: --push_to_hub to 'my run': Repo id must use alphanumeric chars")  # the folder's name, not its path
    with pytest.raises(SystemExit, match=r"^error: --push_to_hub to 'my run': .* default: --output_dir's last folder"):
        run_trainer.main([*TINY, *data, "--output_dir", str(tmp_path / "my run"), "--push_to_hub"])
    assert not out.exists() and not (tmp_path / "my run").exists()


# --- lines ------------------------------------------------------------------------------------------------------

def test_lines_split_at_newlines_only():
    assert split_lines("a\u2028b\x85c\fd\ve\u2029\nf\r\n\ng") == ["a\u2028b\x85c\fd\ve\u2029", "f", "", "g"]
    assert split_lines("") == [] and split_lines("\n") == [""]


def test_aligned_files_stay_aligned_whatever_the_characters(tmp_path):
    # 4 lines each by `wc -l`; one English line holds U+2028, which str.splitlines() breaks at.
    (tmp_path / "p.en").write_text("One.\nTwo\u2028still two.\nThree.\nFour.\n", encoding="utf-8")
    (tmp_path / "p.de").write_text("Eins.\nZwei.\nDrei.\nVier.\n", encoding="utf-8")
    pairs = load_pairs("en", "de", files={"train": str(tmp_path / "p")})["train"]
    assert pairs[1] == ("Two\u2028still two.", "Zwei.") and pairs[3] == ("Four.", "Vier.")


@pytest.mark.parametrize("table_lines", [10_000, 1])
def test_a_byte_order_mark_at_a_files_start_is_not_read_as_text(tmp_path, monkeypatch, table_lines):
    """Some editors begin a UTF-8 file with U+FEFF: not part of the first sentence (a BPE would see an unknown
    character); the same character later in a file is kept, also where it starts one of the tables a file is read
    in (of 1 line each here)."""
    monkeypatch.setattr(training.data, "RECORD_BATCH", table_lines)
    (tmp_path / "p.en").write_text("\ufeffOne.\n\ufeffTwo.\n", encoding="utf-8")
    (tmp_path / "p.de").write_text("\ufeffEins.\nZwei.\n", encoding="utf-8")
    pairs = load_pairs("en", "de", files={"train": str(tmp_path / "p")})["train"]
    assert pairs == [("One.", "Eins."), ("\ufeffTwo.", "Zwei.")]


# --- vaswani-translate --------------------------------------------------------------------------------------------

@pytest.fixture
def cli(cli):
    """support's `cli` as (exit status, stdout, stderr stripped)."""

    def run(*args, stdin: bytes = b""):
        result = cli(*args, stdin=stdin)
        return result.returncode, result.stdout, result.stderr.strip()

    return run


def test_one_output_line_for_each_input_line_whatever_the_characters(translation_folder, cli):
    code, out, err = cli("--model", translation_folder, "--num_beams", "1",
                         stdin="A dog\u2028runs.\n\nThe\x85man\fsees\vit.\n".encode())
    assert code == 0, err
    lines = out.split("\n")
    assert len(lines) == 4 and lines[1] == "" and lines[3] == "", out


def test_a_byte_order_mark_before_the_first_line_is_not_translated(translation_folder, cli):
    code, marked, err = cli("--model", translation_folder, "--num_beams", "1", stdin="\ufeffA dog runs.\n".encode())
    assert code == 0, err
    assert marked == cli("--model", translation_folder, "--num_beams", "1", stdin=b"A dog runs.\n")[1]


def test_a_name_or_owner_and_name_is_a_hub_id_and_anything_else_a_path(tmp_path, monkeypatch):
    """What the tools send to the Hub: "name" and "owner/name" that are not folders here; a path is local, one that
    starts as a path does, has a folder above it here, or has more parts than a Hub id."""
    (tmp_path / "org").mkdir()
    monkeypatch.chdir(tmp_path)
    assert not is_local("t5-small") and not is_local("Helsinki-NLP/opus-mt-en-de")
    assert all(map(is_local, ["org", "org/name", "./name", "~/name", "/name", "a/b/c"]))


@pytest.mark.parametrize("case", ["latin-1 stdin", "latin-1 file", "missing input", "device cuda",
                                  "device cuda:2 of 2", "device mps", "device bogus", "output is a folder",
                                  "mistyped relative path", "home path", "deep path",
                                  "marian folder", "no padding token", "no tokenizer", "a run not ended",
                                  "no beams", "no tokens", "alpha not a number", "alpha infinite", "a checkpoint",
                                  "damaged generation_config.json", "blank input", "blank output", "blank model",
                                  "extra length negative", "extra length of a published decoding",
                                  "input is a folder", "output in a missing folder", "output in a folder not ours",
                                  "ctranslate2 on mps"])
def test_vaswani_translate_misuse_is_one_line(translation_folder, tmp_path, capfd, monkeypatch, case):
    """In this process (support.refused_translation); the command itself in the tests below."""
    args, stdin = ["--model", translation_folder], b"A dog runs.\n"
    if case == "latin-1 stdin":
        stdin = "Café.\n".encode("latin-1")
    if case == "latin-1 file":
        (tmp_path / "in.txt").write_bytes("A dog.\nCafé.\n".encode("latin-1"))
        args += ["--input", tmp_path / "in.txt"]
    if case == "missing input":
        args += ["--input", tmp_path / "no-such.txt"]
    if case in ("device cuda", "device cuda:2 of 2"):  # the GPUs torch counts
        monkeypatch.setattr(torch.cuda, "device_count", lambda: 2 * case.endswith("of 2"))
        args += ["--device", case.split()[1]]
    if case == "device mps":  # torch's own error: a RuntimeError's traceback
        if torch.backends.mps.is_available():
            pytest.skip("this machine has an Apple GPU")
        args += ["--device", "mps"]
    if case == "device bogus":
        args += ["--device", "bogus"]
    if case == "output is a folder":
        args += ["--output", tmp_path]
    if case == "mistyped relative path":
        (tmp_path / "rel").mkdir()
        monkeypatch.chdir(tmp_path)
        args = ["--model", "rel/nomodel"]
    if case in ("home path", "deep path"):  # paths, never sent to the Hub as ids
        monkeypatch.chdir(tmp_path)
        args = ["--model", {"home path": "~/nomodel", "deep path": "org/name/nomodel"}[case]]
    if case == "no padding token":  # neither tokenizer_config.json nor tokenizer.json names one
        shutil.copytree(translation_folder, tmp_path / "unpadded")
        (tmp_path / "unpadded" / "tokenizer_config.json").unlink()
        tokenizer = json.loads((tmp_path / "unpadded" / "tokenizer.json").read_text(encoding="utf-8"))
        (tmp_path / "unpadded" / "tokenizer.json").write_text(json.dumps({**tokenizer, "padding": None}),
                                                              encoding="utf-8")
        args = ["--model", tmp_path / "unpadded"]
    if case == "a run not ended":  # run.py's output folder while it trains: a tokenizer and checkpoints
        shutil.copytree(translation_folder, tmp_path / "run" / "checkpoint-12")
        shutil.copytree(translation_folder, tmp_path / "run" / "checkpoint-3")  # after checkpoint-12 by name only
        (tmp_path / "run" / "checkpoint-40").mkdir()  # a save begun, its config.json not yet written
        shutil.copy(translation_folder / "tokenizer.json", tmp_path / "run")
        args = ["--model", tmp_path / "run"]
    if case == "no tokenizer":  # model.save_pretrained alone, the tokenizer not saved beside it
        shutil.copytree(translation_folder, tmp_path / "untokenized")
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (tmp_path / "untokenized" / name).unlink()
        args = ["--model", tmp_path / "untokenized"]
    if case == "marian folder":
        save_marian_folder(tmp_path / "marian")
        args = ["--model", tmp_path / "marian"]
    if case == "no beams":
        args += ["--num_beams", "0"]
    if case == "no tokens":
        args += ["--max_tokens", "-5"]
    if case == "alpha not a number":
        args += ["--alpha", "nan"]
    if case == "alpha infinite":
        args += ["--alpha", "inf"]
    if case == "extra length negative":
        args += ["--extra_length", "-1"]
    if case == "extra length of a published decoding":  # a converted model's generation config: no gnmt_alpha
        shutil.copytree(translation_folder, tmp_path / "published")
        generation = json.loads((tmp_path / "published" / "generation_config.json").read_text(encoding="utf-8"))
        del generation["gnmt_alpha"]
        (tmp_path / "published" / "generation_config.json").write_text(json.dumps(generation), encoding="utf-8")
        args = ["--model", tmp_path / "published", "--extra_length", "300"]
    if case == "a checkpoint":  # run.py's checkpoints before they were models
        (tmp_path / "checkpoint-9").mkdir()
        for name in ("model.safetensors", "optimizer.safetensors", "trainer_state.json"):
            (tmp_path / "checkpoint-9" / name).write_text("{}", encoding="utf-8")
        args = ["--model", tmp_path / "checkpoint-9"]
    if case in ("blank input", "blank output", "blank model"):
        args += [f"--{case.split()[1]}", " " * (case != "blank output")]  # a space, or an unset variable
    if case == "input is a folder":
        args += ["--input", tmp_path]
    if case == "output in a missing folder":
        args += ["--output", tmp_path / "missing" / "out.txt"]
    if case == "output in a folder not ours":  # a read-only disk, another user's folder: the partial file failed
        monkeypatch.setattr(os, "access", lambda path, mode: str(path) != str(tmp_path))
        args += ["--output", tmp_path / "out.txt"]
    if case == "ctranslate2 on mps":
        args += ["--engine", "ctranslate2", "--device", "mps"]
    if case == "damaged generation_config.json":  # transformers would decode greedily, not with the folder's beams
        shutil.copytree(translation_folder, tmp_path / "damaged")
        text = (tmp_path / "damaged" / "generation_config.json").read_text(encoding="utf-8")
        (tmp_path / "damaged" / "generation_config.json").write_text(text[:len(text) // 2], encoding="utf-8")
        args = ["--model", tmp_path / "damaged"]
    expected = {"latin-1 stdin": "standard input is not UTF-8 text: byte 0xe9 on line 1",
                "latin-1 file": "in.txt is not UTF-8 text: byte 0xe9 on line 2",
                "missing input": f"--input {tmp_path / 'no-such.txt'}: no such file",
                "input is a folder": f"--input {tmp_path}: no such file",
                "output in a missing folder": f"--output {tmp_path / 'missing' / 'out.txt'}: not a file in an "
                "existing folder", "ctranslate2 on mps": "error: --device mps: CTranslate2 runs on cpu or cuda",
                "output in a folder not ours": f"error: --output {tmp_path / 'out.txt'}: {tmp_path} is not writable",
                "device cuda": "error: --device cuda: this machine has no CUDA GPU that torch can use",
                "device cuda:2 of 2": "error: --device cuda:2: torch can use cuda:0 to cuda:1 here",
                "device mps": "error: --device mps: this machine has no mps device that torch can use",
                "device bogus": "--device bogus", "output is a folder": "--output",
                "mistyped relative path": "rel/nomodel is not a model folder",
                "home path": "error: ~/nomodel is not a model folder (no config.json there)",
                "deep path": "error: org/name/nomodel is not a model folder (no config.json there)",
                "no padding token": f"error: the tokenizer of {tmp_path / 'unpadded'} has no padding token",
                "no tokenizer": f"error: {tmp_path / 'untokenized'} has no tokenizer (no tokenizer.json or "
                "tokenizer_config.json there): save it beside the model, tokenizer.save_pretrained(folder)",
                "a run not ended": f"error: {tmp_path / 'run'} holds a training run whose model is not written yet "
                f"(the run writes it when it ends): give its newest checkpoint, {tmp_path / 'run' / 'checkpoint-12'}",
                "marian folder": f"error: {tmp_path / 'marian'} holds a 'marian' model, not a vaswani_hf one: convert "
                f"it, vaswani-convert marian {tmp_path / 'marian'} OUT",
                "no beams": "error: --num_beams 0: must be at least 1",
                "no tokens": "error: --max_tokens -5: must be at least 1",
                "alpha not a number": "error: --alpha nan: must be finite and at least 0",
                "alpha infinite": "error: --alpha inf: must be finite and at least 0",
                "extra length negative": "error: --extra_length -1: must be at least 0",
                "extra length of a published decoding": f"error: --extra_length limits the paper's search, and "
                f"{tmp_path / 'published'} decodes as it was published: give --alpha too",
                "a checkpoint": "checkpoint-9 is a checkpoint of a training run, not a model folder",
                "blank input": "error: --input is blank: give a file, or leave the flag out for standard input",
                "blank output": "error: --output is blank: give a file, or leave the flag out for standard output",
                "blank model": "error: the model is blank: give its folder or Hub id",  # not the current folder
                "damaged generation_config.json": f"error: cannot load a model from {tmp_path / 'damaged'}: It looks "
                f"like the config file at '{tmp_path / 'damaged' / 'generation_config.json'}' is not a valid JSON"}
    assert expected[case] in refused_translation(capfd, monkeypatch, *args, stdin=stdin)


def test_translate_in_python_refuses_what_it_cannot_take_in_one_line(translation_folder):
    """Sources that are not a list of strings (a string would be translated a character at a time), a beam size or
    `max_tokens` under 1 (0 took the model's beam size, and decoded a source at a time), `nbest` outside 1 to the beam
    size, an α that is negative or not finite; the same words whatever the engine."""
    model, tokenizer = load(str(translation_folder), "cpu", fast=False)
    for sources, got in (("A dog runs.", "str"), (["A dog.", None], "a list holding NoneType"), (iter(["A"]), "")):
        with pytest.raises(TypeError, match=f"^sources: a list of strings, got {got or 'list_iterator'}$"):
            translate(model, tokenizer, sources)
    for name in ("num_beams", "max_tokens", "nbest"):
        with pytest.raises(ValueError, match=f"^{name} must be a whole number of at least 1, got 0$"):
            list(translations(model, tokenizer, ["A dog."], **{name: 0}))
    with pytest.raises(ValueError, match="^nbest must be at most num_beams=4, got 5$"):  # CTranslate2 said it its way
        list(translations(model, tokenizer, ["A dog."], num_beams=4, nbest=5))
    for alpha in (-1.0, math.nan, math.inf):  # CTranslate2 took any
        with pytest.raises(ValueError, match=f"^alpha must be a finite number of at least 0, got {alpha}$"):
            translate(model, tokenizer, ["A dog."], alpha=alpha)
    assert translate(model, tokenizer, ("A dog.", "")) == translate(model, tokenizer, ["A dog.", ""])


@pytest.mark.parametrize("misfit", ["a tensor missing", "a tensor left over", "a shape of another model"])
def test_weights_that_do_not_fit_their_config_are_one_line_and_a_fine_tuning_run_writes_nothing(
        translation_folder, tmp_path, capfd, monkeypatch, data, misfit):
    """transformers loads such weights with a warning, a missing tensor drawn afresh: vaswani-translate decoded with
    it, and a fine-tuning run (run.py, run_trainer.py) trained it, after reading its data and writing its tokenizer."""
    from safetensors.torch import load_file, save_file

    folder, key = tmp_path / "misfit", "model.encoder.layers.0.fc1.bias"
    shutil.copytree(translation_folder, folder)
    weights = load_file(folder / "model.safetensors")
    d_ff = weights[key].shape[0]
    if misfit == "a tensor missing":
        del weights[key], weights[key.replace("fc1", "fc2")]  # two: the first named, the other counted
    elif misfit == "a tensor left over":
        weights["model.encoder.layers.9.fc1.bias"] = weights[key].clone()
    else:
        weights[key] = weights[key][1:].clone()
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    named = {"a tensor missing": f"{key} is missing (and 1 more)",
             "a tensor left over": "model.encoder.layers.9.fc1.bias is not part of the model",
             "a shape of another model": f"{key} is ({d_ff - 1},), the config makes it ({d_ff},)"}[misfit]
    expected = f"error: the weights of {folder} do not fit its config: {named}"
    assert refused_translation(capfd, monkeypatch, "--model", folder, stdin=b"A dog runs.\n") == expected
    out = tmp_path / "out"
    start = ["--model_name_or_path", str(folder), "--output_dir", str(out), "--max_steps", "1"]
    assert refused(monkeypatch, *data, *start) == expected
    with pytest.raises(SystemExit) as stop:
        run_trainer.main([*data, *start])
    assert str(stop.value.code) == expected and not out.exists()


def test_transformers_logging_and_bars_come_back_as_they_were_after_a_quiet_load():
    """`transformers_quiet` (the tools' loading) silences transformers' warnings and bars inside, and leaves its
    verbosity and progress bars as the caller had them, on or off."""
    from transformers.utils import logging as hf_logging

    from vaswani_hf.tools.loading import transformers_quiet

    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    try:
        for level, bar in ((hf_logging.INFO, False), (hf_logging.WARNING, True)):
            hf_logging.set_verbosity(level)
            (hf_logging.enable_progress_bar if bar else hf_logging.disable_progress_bar)()
            with transformers_quiet():
                assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == (hf_logging.ERROR, False)
            assert (hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()) == (level, bar)
    finally:
        hf_logging.set_verbosity(verbosity)
        (hf_logging.enable_progress_bar if bars else hf_logging.disable_progress_bar)()


def test_an_error_without_a_message_is_named_by_its_type():
    from vaswani_hf.tools.loading import first_line

    assert (first_line(KeyError()), first_line(OSError(" \n")), first_line(ValueError("one\ntwo"))) == (
        "KeyError", "OSError", "one")


def test_an_existing_output_file_is_kept_unless_overwrite_is_given(translation_folder, tmp_path, cli):
    """One line on stderr, nothing on stdout, the file untouched; with --overwrite, replaced."""
    (tmp_path / "out.txt").write_text("earlier translations\n", encoding="utf-8")
    args = ["--model", translation_folder, "--output", tmp_path / "out.txt"]
    code, out, err = cli(*args, stdin=b"A dog runs.\n")
    assert code != 0 and out == ""
    assert err == f"error: --output {tmp_path / 'out.txt'} exists: give --overwrite to replace it"
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "earlier translations\n"
    code, out, err = cli(*args, "--overwrite", "--quiet", stdin=b"A dog runs.\n")
    assert code == 0 and len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 1, err


def test_a_run_that_fails_midway_keeps_the_earlier_output_whole(translation_folder, tmp_path, cli):
    """--overwrite replaces the file only when every line is translated; what was translated is in .partial. A stream
    is read as it is translated: its second window, not UTF-8, stops the command midway."""
    (tmp_path / "out.txt").write_text("earlier translations\n", encoding="utf-8")
    code, out, err = cli("--model", translation_folder, "--output", tmp_path / "out.txt", "--overwrite", "--window",
                         "1", "--num_beams", "1", "--quiet", stdin=b"A dog runs.\nA caf\xe9.\n")
    assert code != 0 and out == "" and len(err.splitlines()) == 1, err
    assert "standard input is not UTF-8 text: byte 0xe9 on line 2" in err, err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "earlier translations\n"
    assert len((tmp_path / "out.txt.partial").read_text(encoding="utf-8").splitlines()) == 1
    (tmp_path / "in.txt").write_bytes(b"A dog runs.\nA cat.\n")
    code, _, err = cli("--model", translation_folder, "--input", tmp_path / "in.txt", "--output",
                       tmp_path / "out.txt", "--overwrite", "--window", "1", "--num_beams", "1", "--quiet")
    assert code == 0 and len((tmp_path / "out.txt").read_text(encoding="utf-8").splitlines()) == 2, err
    assert not (tmp_path / "out.txt.partial").exists()


@pytest.mark.parametrize("nbest", [1, 2])
def test_a_killed_run_is_continued_by_resume_into_the_output_of_one_run(translation_folder, tmp_path, cli, nbest):
    """A killed run leaves OUTPUT.partial, its last line cut short: the same command again is refused, the file kept;
    with --resume the whole lines it holds stay as they are (here made recognisable) and the lines after them are
    translated, windows and --nbest's numbering going on: the one run's output. A shorter input is refused."""
    sources = ["The small dog sees the old man.", "", "A woman reads.", "The children play.", "A dog.", "", "A man."]
    (tmp_path / "in.txt").write_text("\n".join(sources) + "\n", encoding="utf-8")
    common = ["--model", translation_folder, "--quiet", "--nbest", str(nbest), "--num_beams", "2"]
    code, _, err = cli(*common, "--input", tmp_path / "in.txt", "--output", tmp_path / "one.txt")
    assert code == 0, err
    whole = (tmp_path / "one.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    partial = tmp_path / "out.txt.partial"
    kept = ["kept\n"] * (3 * nbest)  # three lines' translations
    cut = "".join(whole[3 * nbest:4 * nbest - 1]) + whole[4 * nbest - 1][:5]  # the fourth line's last one cut short
    partial.write_text("".join(kept) + cut, encoding="utf-8")
    args = [*common, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt", "--window", "2"]
    assert cli(*args)[2] == (f"error: {partial} holds an earlier run's translations: give --resume to continue a "
                             "stopped run, or --overwrite to start again")
    assert cli(*common, "--resume")[2] == ("error: --resume continues the OUTPUT.partial file of an --output: give "
                                           "the --output")
    assert partial.read_text(encoding="utf-8").startswith("".join(kept))
    code, _, err = cli(*args, "--resume")
    assert code == 0, err
    written = (tmp_path / "out.txt").read_text(encoding="utf-8")
    assert written == "".join(kept + whole[3 * nbest:]) and not partial.exists()
    (tmp_path / "out2.txt.partial").write_text("".join(whole),
                                               encoding="utf-8")  # all seven lines, and an input of five
    code, _, err = cli(*common, "--output", tmp_path / "out2.txt", "--resume",
                       stdin="\n".join(sources[:5]).encode())
    assert code == 1 and err == (f"error: {tmp_path / 'out2.txt.partial'} holds translations of 7 lines, and the "
                                 "standard input has 5: not this input's (--overwrite starts again)")


def test_a_killed_scoring_run_is_continued_by_resume_into_the_output_of_one_run(translation_folder, tmp_path, cli):
    """--score --resume: the whole lines of OUTPUT.partial stay (here made recognisable), and the pairs after them
    are scored, both files read on from the same line: the one run's output (the same command's: windows of 2 lines,
    so the batches after the kept lines are the uninterrupted run's, and so are their sums)."""
    pairs = [("The small dog sees the old man.", "Der kleine Hund sieht den alten Mann."), ("", "Ein Hund."),
             ("A woman reads.", "Eine Frau liest."), ("The children play.", "Die Kinder spielen."), ("A dog.", "")]
    for name, side in (("in.txt", 0), ("de.txt", 1)):
        (tmp_path / name).write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")
    common = ["--model", translation_folder, "--quiet", "--input", tmp_path / "in.txt", "--score", tmp_path / "de.txt",
              "--window", "2"]
    code, _, err = cli(*common, "--output", tmp_path / "one.txt")
    assert code == 0, err
    whole = (tmp_path / "one.txt").read_text(encoding="utf-8").splitlines(keepends=True)
    (tmp_path / "out.txt.partial").write_text("kept\nkept\n" + whole[2][:3],
                                              encoding="utf-8")  # the third line cut short
    code, _, err = cli(*common, "--output", tmp_path / "out.txt", "--resume")
    assert code == 0, err
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "".join(["kept\n", "kept\n", *whole[2:]])


@pytest.mark.parametrize("stop", ["full disk", "Ctrl-C"])
def test_a_translation_stopped_by_a_full_disk_or_ctrl_c_says_so_in_one_line_and_resume_ends_it_as_one_run(
        translation_folder, tmp_path, cli, monkeypatch, stop):
    """Stopped after two lines' translations: one line naming OUTPUT.partial, which keeps them (a full disk: status
    1; Ctrl-C: 130, a SIGINT's); with --resume, once there is room, the output is the one run's."""
    from vaswani_hf.tools import translate as translate_module

    class Stopped:
        """A file that takes `room` more lines, then the disk is full or the user presses Ctrl-C."""

        def __init__(self, file, room: int):
            self.file, self.room = file, room

        def write(self, text: str) -> int:
            self.room -= text.count("\n")
            if self.room < 0:
                raise OSError(errno.ENOSPC, "No space left on device") if stop == "full disk" else KeyboardInterrupt
            return self.file.write(text)

        def __getattr__(self, name):
            return getattr(self.file, name)

        def __enter__(self):
            return self

        def __exit__(self, *exception):
            self.file.close()

    (tmp_path / "in.txt").write_text("A dog runs.\nA cat.\nA man.\nThe woman reads.\n", encoding="utf-8")
    args = ["--model", translation_folder, "--input", tmp_path / "in.txt", "--window", "1", "--quiet"]
    code, _, err = cli(*args, "--output", tmp_path / "one.txt")
    assert code == 0, err
    partial = tmp_path / "out.txt.partial"
    with monkeypatch.context() as patch:
        patch.setattr(translate_module, "open", lambda *a, **k: Stopped(open(*a, **k), room=2),  # noqa: SIM115
                      raising=False)
        said = cli(*args, "--output", tmp_path / "out.txt")[::2]
    full = f"error: {partial}: No space left on device: its translations are kept; make room, then add --resume"
    ctrl_c = f"stopped: {partial} keeps the translations written; the same command with --resume goes on"
    assert said == ((1, full) if stop == "full disk" else (130, ctrl_c))
    one = (tmp_path / "one.txt").read_text(encoding="utf-8")
    assert partial.read_text(encoding="utf-8").splitlines() == one.splitlines()[:2]
    code, _, err = cli(*args, "--output", tmp_path / "out.txt", "--resume")
    assert code == 0 and (tmp_path / "out.txt").read_bytes() == (tmp_path / "one.txt").read_bytes(), err


def test_a_second_run_of_the_same_output_started_at_once_leaves_the_first_ones_translations(translation_folder,
                                                                                            tmp_path, cli,
                                                                                            monkeypatch):
    """Both pass the check for OUTPUT.partial before either has made it; the one that comes second to make it is
    refused in one line and leaves the first one's file as it was."""
    from vaswani_hf.tools import translate as translate_module

    (tmp_path / "in.txt").write_text("A dog runs.\n", encoding="utf-8")
    partial, load_engine = tmp_path / "out.txt.partial", translate_module.load_engine

    def first_run_makes_it_meanwhile(*args, **kwargs):
        partial.write_text("the first run's line\n", encoding="utf-8")
        return load_engine(*args, **kwargs)

    monkeypatch.setattr(translate_module, "load_engine", first_run_makes_it_meanwhile)
    said = cli("--model", translation_folder, "--input", tmp_path / "in.txt", "--output", tmp_path / "out.txt")
    refused = (f"error: {partial} was made by another run of this --output while this one loaded its model: let "
               "that one finish, or give --overwrite")
    assert said[::2] == (1, refused)
    assert partial.read_text(encoding="utf-8") == "the first run's line\n" and not (tmp_path / "out.txt").exists()


def test_a_reader_that_stops_reading_ends_the_translation_without_a_traceback(translation_folder, tmp_path):
    """`vaswani-translate ... | head -1`: the pipe closed under it ends the command quietly, status 1."""
    (tmp_path / "in.txt").write_text("A dog runs.\nA cat.\n", encoding="utf-8")
    read, write = os.pipe()
    os.close(read)  # the reader gone before the first line is written
    with os.fdopen(write, "wb") as closed:
        result = subprocess.run([sys.executable, "-m", "vaswani_hf.tools.translate", "--model", translation_folder,
                                 "--input", tmp_path / "in.txt", "--quiet", "--no_fast_cpu"],  # (its timing says so)
                                stdout=closed, stderr=subprocess.PIPE,
                                text=True, cwd=REPOSITORY, timeout=300, check=False)
    assert (result.returncode, result.stderr) == (1, "")


def test_an_input_file_not_utf8_past_its_first_window_is_refused_before_the_model_loads(translation_folder, tmp_path,
                                                                                         cli, monkeypatch):
    """A file is read whole before anything is translated (not a stream): a bad byte on line 4 of 4 stops the command
    before a model is loaded or a line is translated (it stopped after three windows were translated), and the
    earlier output stays."""
    from vaswani_hf.tools import translate

    (tmp_path / "out.txt").write_text("earlier translations\n", encoding="utf-8")
    (tmp_path / "in.txt").write_bytes(b"A dog runs.\nA cat.\nA man.\nA caf\xe9.\n")
    monkeypatch.setattr(translate, "load_engine", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    code, out, err = cli("--model", translation_folder, "--input", tmp_path / "in.txt", "--output",
                         tmp_path / "out.txt", "--overwrite", "--window", "1")
    assert (code, out) == (1, "") and err == (f"error: {tmp_path / 'in.txt'} is not UTF-8 text: byte 0xe9 on line 4 "
                                              "(convert it, e.g. iconv -f latin1 -t utf-8)")
    assert sorted(path.name for path in tmp_path.iterdir()) == ["in.txt", "out.txt"]
    assert (tmp_path / "out.txt").read_text(encoding="utf-8") == "earlier translations\n"


def test_a_compressed_input_file_translates_as_its_text_and_a_damaged_one_is_one_line(translation_folder, tmp_path,
                                                                                      cli, monkeypatch):
    """.gz, .bz2 and .xz, as training/run.py reads its data: the same lines out as the text gives; an archive cut
    short or not one is one line before the model loads."""
    import bz2
    import gzip
    import lzma

    from vaswani_hf.tools import translate

    text = b"The small dog sees the old man.\n\nA woman reads a book.\n"
    (tmp_path / "in.txt").write_bytes(text)
    args = ["--model", translation_folder, "--num_beams", "1", "--quiet"]
    code, expected, err = cli(*args, "--input", tmp_path / "in.txt")
    assert code == 0 and len(expected.splitlines()) == 3, err
    for suffix, compress in ((".gz", gzip.compress), (".bz2", bz2.compress), (".xz", lzma.compress)):
        (tmp_path / f"in.txt{suffix}").write_bytes(compress(text))
        assert cli(*args, "--input", tmp_path / f"in.txt{suffix}") == (0, expected, ""), suffix
    monkeypatch.setattr(translate, "load_engine", lambda *args, **kwargs: pytest.fail("the model was loaded"))
    (tmp_path / "cut.txt.gz").write_bytes(gzip.compress(text)[:-12])
    (tmp_path / "not.txt.xz").write_bytes(text)
    assert cli(*args, "--input", tmp_path / "cut.txt.gz")[2] == (
        f"error: {tmp_path / 'cut.txt.gz'} cannot be read: Compressed file ended before the end-of-stream marker was "
        "reached")
    assert cli(*args, "--input", tmp_path / "not.txt.xz")[2] == (
        f"error: {tmp_path / 'not.txt.xz'} cannot be read: Input format not supported by decoder")


def test_an_input_file_is_counted_and_checked_as_its_windows_read_it(tmp_path):
    """`counted_lines` against text.py's reading of the whole file (the lines, or the same one-line error), for every
    cut of the file into blocks: a character of 2, 3 or 4 bytes cut in two between blocks is no error."""
    from vaswani_hf.tools.text import decode_utf8, split_lines
    from vaswani_hf.tools.translate import counted_lines

    path = tmp_path / "in.txt"
    texts = [b"", b"\n", b"a", "é\n€x\r\n\n𝄞".encode(), "€\n𝄞\n".encode()]
    for data in [*texts, *(text[:i] + bad + text[i:] for text in texts for i in range(len(text) + 1)
                           for bad in (b"\xe9", b"\x80", b"\xf0\x9d"))]:
        path.write_bytes(data)
        try:
            expected = len(split_lines(decode_utf8(data, str(path))))
        except ValueError as error:
            expected = f"error: {error}"
        for block_size in (1, 2, 3, 1 << 20):
            try:
                counted = counted_lines(str(path), block_size)
            except SystemExit as stop:
                counted = str(stop)
            assert counted == expected, (data, block_size)


def test_a_source_longer_than_learned_positions_is_one_line(translation_folder, tmp_path, capfd, monkeypatch,
                                                             cli):
    """12 learned positions: on either engine a longer source (or a longer translation to --score) is refused in one
    line, and a short one translates, greedy, to the same tokens, stopped at the last position at the latest. Each
    engine first times its probes on this model (fast_cpu, CTranslate2's workers: a cache of its own), cut to its 12
    positions."""
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "learned"
    shutil.copytree(translation_folder, folder)
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    config.update(position_embedding="learned", max_position_embeddings=12)
    (folder / "config.json").write_text(json.dumps(config), encoding="utf-8")
    (folder / "model.safetensors").unlink()  # the weights of a learned-position model of this size
    from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

    VaswaniForConditionalGeneration(VaswaniConfig(**{k: v for k, v in config.items() if k not in (
        "architectures", "auto_map", "transformers_version", "model_type")})).save_pretrained(folder)
    translations, threads = [], torch.get_num_threads()
    torch.set_num_threads(2)  # (CTranslate2's workers are measured where there are threads to share)
    try:
        for engine in ("torch", "ctranslate2"):
            lines = "A dog runs.\n" + "the man sees the dog " * 10 + "\n"
            message = refused_translation(capfd, monkeypatch, "--model", folder, "--num_beams", "2", "--engine",
                                          engine, stdin=lines.encode())
            assert message == f"error: line 2 has 71 tokens; this model's positions stop at 12 on the {engine} engine"
            (tmp_path / "in.txt").write_text("A dog runs.\nA cat.\n" + lines,
                                             encoding="utf-8")  # a file: its every line checked first
            code, _, err = cli("--model", folder, "--engine", engine, "--input", tmp_path / "in.txt", "--output",
                               tmp_path / "out.txt", "--window", "1")
            assert code == 1 and err == message.replace("line 2", "line 4")
            assert not (tmp_path / "out.txt.partial").exists()  # lines 1-3 were translated before
            (tmp_path / "two.txt").write_text("A dog runs.\nA cat.\n",
                                              encoding="utf-8")  # --score: a translation too long, on line 2
            (tmp_path / "de.txt").write_text("Ein Hund.\n" + "der Mann sieht den Hund " * 10 + "\n", encoding="utf-8")
            code, _, err = cli("--model", folder, "--engine", engine, "--input", tmp_path / "two.txt", "--score",
                               tmp_path / "de.txt", "--output", tmp_path / "out.txt", "--window", "1")
            assert code == 1 and re.fullmatch(rf"error: line 2's translation has \d+ tokens; this model's positions "
                                              rf"stop at 12 on the {engine} engine", err), err
            assert not (tmp_path / "out.txt.partial").exists()
            code, out, err = cli("--model", folder, "--num_beams", "1", "--engine", engine, stdin=b"A dog runs.\n")
            assert code == 0 and len(out.splitlines()) == 1, err
            translations.append(out)
    finally:
        torch.set_num_threads(threads)
    assert translations[1] == translations[0]


def test_scores_are_refused_in_one_line_before_the_model_loads(tmp_path, capfd, monkeypatch):
    """--score's misuse, each in one line, before the model (here none) loads: files of different lengths (a stream
    whose first window shows it), its file missing, a decoding flag, two divisors, --normalize alone."""
    (tmp_path / "in.txt").write_text("A dog.\nA cat.\nA man.\n", encoding="utf-8")
    (tmp_path / "two.txt").write_text("Ein Hund.\nEine Katze.\n", encoding="utf-8")
    (tmp_path / "de.txt").write_text("Ein Hund.\nEine Katze.\nEin Mann.\n", encoding="utf-8")
    model, sources, two, de = tmp_path / "no-model", tmp_path / "in.txt", tmp_path / "two.txt", tmp_path / "de.txt"
    refusals = {
        ("--input", sources, "--score", two): f"--input {sources} has 3 lines, --score {two} 2: give a translation "
                                              "per line",
        ("--score", two): f"the standard input and --score {two} differ in length, one ending at line 2: give a "
                          "translation per line",
        ("--score", tmp_path / "none.txt"): f"--score {tmp_path / 'none.txt'}: no such file",
        ("--score", de, "--num_beams", "4", "--nbest", "2"): "--num_beams, --nbest: --score scores the translations "
                                                             "given, it decodes nothing",
        ("--score", de, "--extra_length", "9"): "--extra_length: --score scores the translations given, it decodes "
                                                "nothing",
        ("--score", de, "--normalize", "--alpha", "0.6"): "--normalize and --alpha both divide the scores: give one",
        ("--normalize",): "--normalize divides --score's scores: give --score TRANSLATIONS"}
    for args, said in refusals.items():
        assert refused_translation(capfd, monkeypatch, "--model", model, *args,
                                   stdin=sources.read_bytes()) == f"error: {said}"


def test_a_stream_and_translations_of_different_lengths_stop_where_the_shorter_ends(translation_folder, tmp_path,
                                                                                    cli):
    """Read a line at a time, the pairs before are scored, then one line says where the shorter one ended; `score`
    refuses lists of different lengths, or a lone string, in one line."""
    from vaswani_hf.tools.translate import score

    (tmp_path / "de.txt").write_text("Ein Hund.\nEine Katze.\n", encoding="utf-8")
    for stdin, end in ((b"A dog.\nA cat.\nA man.\n", 2), (b"A dog.\n", 1)):
        code, out, err = cli("--model", translation_folder, "--score", tmp_path / "de.txt", "--window", "1",
                             "--quiet", stdin=stdin)
        assert code == 1 and len(out.splitlines()) == end
        assert err == (f"error: the standard input and --score {tmp_path / 'de.txt'} differ in length, one ending at "
                       f"line {end}: give a translation per line")
    model, tokenizer = load(str(translation_folder), "cpu", fast=False)
    with pytest.raises(ValueError, match="^2 sources and 1 targets: give one target per source$"):
        score(model, tokenizer, ["A dog.", "A cat."], ["Ein Hund."])
    with pytest.raises(TypeError, match="^targets: a list of strings, got str$"):
        score(model, tokenizer, ["A dog."], "Ein Hund.")


def test_a_source_is_refused_past_the_last_position_by_its_line_in_the_input(translation_folder):
    """A window's lines are numbered from the window's first; a source of exactly as many tokens as positions fits."""
    import types

    from transformers import AutoTokenizer

    from vaswani_hf.tools.translate import check_lengths

    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    fits = len(tokenizer("A dog runs.")["input_ids"])
    engine = types.SimpleNamespace(positions=fits, name="torch")
    check_lengths(engine, tokenizer, ["A dog runs.", "A dog."], first_line=5)
    with pytest.raises(SystemExit, match=rf"^error: line 6 has \d+ tokens; this model's positions stop at {fits} "):
        check_lengths(engine, tokenizer, ["A dog runs.", "A dog runs. A dog runs."], first_line=5)


class RecordingEngine:
    """An engine of `positions` learned positions that scores every pair 0 and keeps the batches it was given."""

    name = "recording"

    def __init__(self, positions: int):
        self.positions, self.batches = positions, []

    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[float]:
        self.batches.append((sources, targets))
        return [0.0] * len(sources)


def test_score_in_python_checks_and_batches_each_pair_by_its_longer_side(translation_folder):
    """`score`: a target longer than the engine's positions is a one-line ValueError before any pair is scored, one of
    exactly as many tokens fits; a batch holds at most `max_tokens` tokens of each pair's longer side."""
    from transformers import AutoTokenizer

    from vaswani_hf.tools.translate import score

    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    short, long = "A dog.", "The man sees the dog and the woman sees the small cat."
    fits = len(tokenizer(text_target=[long])["input_ids"][0])
    engine = RecordingEngine(positions=fits)
    assert len(score(engine, tokenizer, [short, short, short], [long, short, short], max_tokens=fits)) == 3
    for sources, targets in engine.batches:
        assert len(sources) * max(map(len, sources + targets)) <= fits or len(sources) == 1
    engine = RecordingEngine(positions=fits - 1)
    with pytest.raises(ValueError, match=f"^a source or target has {fits} tokens; this model's positions stop at "
                                         f"{fits - 1}$"):
        score(engine, tokenizer, [short], [long])
    assert engine.batches == []


def test_sinusoids_refuse_no_source_for_its_length():
    from vaswani_hf import VaswaniConfig
    from vaswani_hf.tools.loading import learned_positions

    assert learned_positions(VaswaniConfig(max_position_embeddings=8)) is None
    assert learned_positions(VaswaniConfig(max_position_embeddings=8, position_embedding="learned")) == 8


def test_a_folder_without_tokenizer_config_translates_as_the_complete_one(translation_folder, tmp_path, cli):
    """tokenizer.json holds the vocabulary, the special tokens and </s> after each source: enough to translate.
    (The command's output equals `translate` on the loaded folder: test_ecosystem.py.)"""
    folder = tmp_path / "model"
    shutil.copytree(translation_folder, folder)
    (folder / "tokenizer_config.json").unlink()
    sources = ["A dog runs.", "The old man sees the small dog and the cat."]
    code, partial, err = cli("--model", folder, stdin="".join(f"{line}\n" for line in sources).encode())
    assert code == 0, err
    complete = translate(*load(str(translation_folder), device="cpu"), sources)
    assert partial.splitlines() == complete and all(complete)


@pytest.mark.parametrize("script", ["run.py", "run_trainer.py"])
def test_on_several_processes_a_refusal_is_said_once(tmp_path, data, script):
    """Every process of `accelerate launch --multi_gpu --num_processes 2` checks its flags, the output folder and
    the data alike and stops; the first alone says why (two copies of a line, written at once, interleave)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine", encoding="utf-8")
    for flags, message in (
            (["--d_model", "30"], "error: VaswaniConfig: d_model=30 is not divisible by num_heads=4"),
            ([], f"error: --output_dir {tmp_path / 'out'} "),  # not empty
            (["--evalb", "--validation_file", data[1], "--output_dir", tmp_path / "new"],
             "error: --evalb: the validation targets are not linearized trees")):
        ranks = accelerate_ranks(2, "--multi_gpu", "--mixed_precision", "no", "--dynamo_backend", "no",
                                 port=free_port())
        result = run_forked([*TINY, *data, "--output_dir", tmp_path / "out", *flags], ranks, timeout=300,
                            script=REPOSITORY / "training" / script)
        said = [line for line in result.stderr.splitlines() if line.startswith("error")]
        assert result.returncode == 1 and len(said) == 1 and said[0].startswith(message), result.stderr[-2000:]
