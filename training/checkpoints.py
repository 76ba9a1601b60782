"""Checkpoints that survive a kill (§5.2/§6.1: the paper wrote one every 10 minutes and averaged the last few).

A checkpoint is a folder `checkpoint-<step>` holding the run's whole state as data: the model as `save_pretrained`
writes it, with the tokenizer (the full weights in `model.safetensors`, gathered from every process whatever the
layout: one process, DDP or FSDP; config, generation config, code files), so that the folder is also a model folder
that `from_pretrained` and `vaswani-translate` load; Adam's state (`optimizer.safetensors`, its hyperparameters as
JSON in the header), each process's random generators (`rng_state_<rank>.safetensors`: torch's, Python's and
NumPy's), under fp16 the loss scale (`scaler.json`), and `trainer_state.json` (the step, the run's history, the
learning-rate schedule). It is written under a temporary name and renamed into place when complete, so a kill during a
save leaves the previous checkpoints untouched and never produces a half-written `checkpoint-<step>`.

With --enable_jit_checkpoint, a SIGTERM (a preempted machine, a job's time limit) ends training with a checkpoint
after the step under way (`SigtermCheckpoint`). That checkpoint holds a `preempted.txt`: resuming reads it as any
other, the count of checkpoints kept leaves it out, and the run's next checkpoint, its last included, replaces it: the
final average is of the schedule's checkpoints alone (§6.1's were written at intervals).

No kernel is chosen by timing during a run: the same command gives the same weights, however busy the machine. (On a
CPU, the run trains and decodes with the plan `vaswani_hf.fast_cpu` measured once for the machine and kept;
trainer_state.json keeps it too: a resumed run computes as the first did.)

Nothing is pickled, written or read: safetensors and JSON only (and the model's code files, which resuming never
runs). Every file is fsynced before the rename, and trainer_state.json records each file's size and SHA-256, so a
checkpoint damaged later (a full disk, a truncated copy) is found when it is read: `latest` and the final averaging
skip it with one warning line.
"""

import contextlib
import hashlib
import json
import os
import random
import re
import shutil
import signal
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from training.distributed import full_state_dict, unwrap
from training.faults import fault_point
from training.hub import save_tokenizer
from vaswani_hf.tools.loading import first_line
from vaswani_hf.tools.text import refused_write

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
SCALER_FILE = "scaler.json"
PREEMPTED_FILE = "preempted.txt"
NUMBER = "#number"  # an optimizer's state that is a Python number, saved as a tensor of one value


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first (not verified: see `verified`)."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir()
             if (m := CHECKPOINT.match(p.name)) and (p / STATE_FILE).is_file()]
    return [path for _, path in sorted(found)]


def preempted(path: Path) -> bool:
    """Whether the checkpoint at `path` was written on SIGTERM (`SigtermCheckpoint`) rather than by the schedule."""
    return (path / PREEMPTED_FILE).is_file()


def damage(path: Path, only: tuple[str, ...] | None = None) -> str | None:
    """Why the checkpoint at `path` cannot be trusted (its files against the sizes and SHA-256 sums its
    trainer_state.json recorded; `only`: just these files), or None if it is intact."""
    try:
        files = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{STATE_FILE} is missing or unreadable"
    if only is None:
        written = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} - {STATE_FILE}
        if written - files.keys():
            return f"holds {min(written - files.keys())}, which the run did not write"
    for name, expected in files.items():
        if only is not None and name not in only:
            continue
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != expected["bytes"]:
            return f"{name} has {file.stat().st_size} bytes, {expected['bytes']} were written"
        if _sha256(file) != expected["sha256"]:
            return f"{name} does not hold what was written (SHA-256 differs)"
    return None


def verified(found: list[Path], say, only: tuple[str, ...] | None = None) -> list[Path]:
    """The intact checkpoints among `found`; one warning line through `say` for each damaged one."""
    intact = []
    for path in found:
        reason = damage(path, only)
        if reason:
            say(f"warning: {path.name} is damaged ({reason}): left out")
        else:
            intact.append(path)
    return intact


def resolve_checkpoint(output_dir: str | Path, name: str, say=print) -> Path:
    """`latest` -> the newest intact checkpoint of output_dir (a damaged newer one gets a warning line);
    otherwise a checkpoint folder path, which must be intact."""
    if name == "latest":
        for path in reversed(checkpoints(output_dir)):
            refuse_other_entry_point(name, path, "training/run.py")
            reason = damage(path)
            if reason is None:
                return path
            say(f"warning: {path.name} is damaged ({reason}): trying the one before it")
        raise FileNotFoundError(f"--resume_from_checkpoint latest: no intact checkpoint in {output_dir}")
    path = Path(name)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"--resume_from_checkpoint {name}: not a complete checkpoint (no {STATE_FILE})")
    refuse_other_entry_point(name, path, "training/run.py")
    reason = damage(path)
    if reason:
        raise FileNotFoundError(f"--resume_from_checkpoint {name}: damaged ({reason})")
    return path


def refuse_other_entry_point(name: str, path: Path, resuming: str) -> None:
    """A FileNotFoundError where the checkpoint at `path` was written by the other entry point than `resuming`:
    run.py's trainer_state.json records its files, the Trainer's (training/run_trainer.py's) is its TrainerState."""
    try:
        state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return  # damaged: the entry point's own check says so
    writer = "training/run.py" if "files" in state else "training/run_trainer.py" if "global_step" in state else None
    if writer not in (None, resuming):
        raise FileNotFoundError(f"--resume_from_checkpoint {name}: {path} is {writer}'s: resume it with {writer}")


def leave_timeline(resumed: Path) -> list[Path]:
    """Resuming from `resumed`: the checkpoints after it belong to an abandoned timeline. They are renamed
    abandoned-checkpoint-<step> (kept, never averaged or pruned); returns the new names."""
    step = int(CHECKPOINT.match(resumed.name).group(1))
    moved = []
    for path in checkpoints(resumed.parent):
        if int(CHECKPOINT.match(path.name).group(1)) > step:
            target = path.with_name(f"abandoned-{path.name}")
            shutil.rmtree(target, ignore_errors=True)
            os.replace(path, target)
            moved.append(target)
    return moved


class WriteRefused(OSError):
    """A write the file system refused during a run (`refused_write`), said in one line with what is intact."""


@contextlib.contextmanager
def writing(output_dir: Path, what: str, partial: Path | None = None):
    """`what` written in a run's `output_dir`: a write the disk refuses removes `partial`, the part written (the room
    it took), and is a WriteRefused naming the newest intact checkpoint and how to go on."""
    try:
        yield
    except Exception as error:
        if not refused_write(error):
            raise
        if partial is not None:
            shutil.rmtree(partial, ignore_errors=True)
        kept = checkpoints(output_dir)
        then = (f"{kept[-1].name} is intact; make room, then add --resume_from_checkpoint latest" if kept else
                "no checkpoint was written yet; make room, then start again in an empty folder")
        raise WriteRefused(f"{what} could not be written in {output_dir} ({first_line(error)}): {then}") from None


@contextlib.contextmanager
def stopped_in_one_line(*errors: type[Exception]):
    """A run's error that only its work finds, as a one-line SystemExit: one of `errors`, or a write the disk refused
    (a checkpoint's or the model's names what is intact; another, the file it names). Ctrl-C: one line, from the
    first process, on how to go on (a checkpoint it cut short is not one), and the status 130 of a SIGINT. A process
    of a distributed run whose peer ended (its error said by itself, or a kill): one line saying so, not gloo's
    traceback."""
    try:
        yield
    except KeyboardInterrupt:
        if os.environ.get("RANK", "0") == "0":  # below the progress bar, which nothing closed
            print("\nstopped: the same command with --resume_from_checkpoint latest goes on from the newest intact "
                  "checkpoint", file=sys.stderr)
        raise SystemExit(128 + signal.SIGINT) from None
    except Exception as error:
        if peer_ended(error):
            raise SystemExit(f"error: process {os.environ['RANK']} stopped: another process of the run ended first"
                             ) from None
        if not (isinstance(error, (WriteRefused, *errors)) or refused_write(error)):
            raise
        raise SystemExit(f"error: {error}") from None


class SigtermCheckpoint:
    """--enable_jit_checkpoint (transformers' name): while training, a SIGTERM asks for a checkpoint after the step
    under way, then the run ends with SIGTERM's status, for a scheduler to start it again; a SIGTERM repeated (a
    launcher passing on the one its processes had) changes nothing. Without the flag, and outside training, SIGTERM
    ends the run at once, as always."""

    def __init__(self, enabled: bool):
        self.enabled, self.asked, self.previous = enabled, False, None

    def __enter__(self):
        if self.enabled:
            self.previous = signal.signal(signal.SIGTERM, self._asked)
        return self

    def __exit__(self, *error) -> None:
        if self.enabled:
            signal.signal(signal.SIGTERM, signal.SIG_DFL if self.previous is None else self.previous)

    def _asked(self, signum, frame) -> None:
        if not self.asked and os.environ.get("RANK", "0") == "0":  # below the progress bar
            print("\nSIGTERM: a checkpoint after this step, then the run stops", file=sys.stderr)
        self.asked = True

    def requested(self, accelerator) -> bool:
        """Whether any process has had a SIGTERM: every process gets the same answer (one collective per step, with
        the flag and several processes), so all stop after the same step."""
        if not self.enabled or accelerator.num_processes == 1:
            return self.asked
        asked = torch.tensor([float(self.asked)], device=accelerator.device)
        return accelerator.reduce(asked, reduction="sum").item() > 0


def peer_ended(error: Exception) -> bool:
    """Whether a collective failed because a process it waited for has ended: gloo's words for the closed connection
    (NCCL's processes are stopped by torchrun's signal instead)."""
    return "RANK" in os.environ and isinstance(error, RuntimeError) and any(
        words in str(error) for words in ("Connection closed by peer", "Connection reset by peer"))


def save_checkpoint(accelerator, model, optimizer, output_dir: str | Path, step: int, state: dict, keep: int,
                    tokenizer=None, on_sigterm: bool = False) -> Path:
    """Every process calls this. Writes checkpoint-<step> atomically and durably (`on_sigterm`: marked preempted),
    keeps the newest `keep` of the schedule's and no older preempted one. A write the disk refuses is a
    WriteRefused, the part written removed (the room it took given back)."""
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    temporary = output_dir / f".incomplete-checkpoint-{step}"
    if accelerator.is_main_process:
        for stale in output_dir.glob(".incomplete-checkpoint-*"):  # left by runs killed while saving
            shutil.rmtree(stale)
    with writing(output_dir, final.name, temporary if accelerator.is_main_process else None):
        if accelerator.is_main_process:
            temporary.mkdir(parents=True)
        accelerator.wait_for_everyone()
        save_training_state(accelerator, model, optimizer, temporary, tokenizer)
        if on_sigterm and accelerator.is_main_process:
            (temporary / PREEMPTED_FILE).write_text(
                "written on SIGTERM: resumed as any checkpoint, left out of the final average, replaced by the run's "
                "next checkpoint\n", encoding="utf-8")
        fault_point(f"save-{step}")
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            files = {}
            for file in sorted(temporary.rglob("*")):
                _fsync(file)
                if file.is_file():
                    files[str(file.relative_to(temporary))] = {"bytes": file.stat().st_size, "sha256": _sha256(file)}
            with open(temporary / STATE_FILE, "w", encoding="utf-8") as file:
                json.dump({"step": step, **state, "files": files}, file, indent=1)
                file.flush()
                os.fsync(file.fileno())
            _fsync(temporary)
            shutil.rmtree(final, ignore_errors=True)
            os.replace(temporary, final)
            _fsync(output_dir)
    if accelerator.is_main_process:
        found = {path: preempted(path) for path in checkpoints(output_dir)}
        scheduled = [path for path, on_sigterm in found.items() if not on_sigterm]
        stale = [path for path, on_sigterm in found.items() if on_sigterm and path != final]
        for old in [*scheduled[:max(len(scheduled) - keep, 0)], *stale]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, model, optimizer, path: Path) -> dict:
    """Restores model, optimizer and random generators from a checkpoint that `resolve_checkpoint` found intact;
    returns trainer_state.json (the step, the run's state as saved)."""
    load_training_state(accelerator, model, optimizer, path)
    state = json.loads((path / STATE_FILE).read_text(encoding="utf-8"))
    state.pop("files", None)
    state.pop("kernels", None)  # kernel choices that checkpoints before 2026-11-28 kept
    return state


def save_training_state(accelerator, model, optimizer, folder: Path, tokenizer=None) -> None:
    """Every process calls this: the main one writes the model with its full weights (and the tokenizer), Adam's
    full state and fp16's loss scale, each its random generators."""
    weights = full_state_dict(model)
    save_optimizer(model, optimizer, folder / OPTIMIZER_FILE, accelerator.is_main_process)
    if accelerator.is_main_process:
        unwrap(model).save_pretrained(folder, state_dict={name: t.contiguous() for name, t in weights.items()})
        if tokenizer is not None:
            save_tokenizer(tokenizer, folder)
        save_scaler(accelerator.scaler, folder)
    save_generators(folder / f"rng_state_{accelerator.process_index}.safetensors")


def load_training_state(accelerator, model, optimizer, folder: Path) -> None:
    """Every process calls this and reads the full files; each keeps its own shard."""
    weights = load_file(folder / WEIGHTS_FILE)
    for copy, source in (getattr(unwrap(model), "all_tied_weights_keys", {}) or {}).items():
        weights.setdefault(copy, weights[source])
    set_model_state_dict(model, weights, options=StateDictOptions(full_state_dict=True))
    load_optimizer(model, optimizer, folder / OPTIMIZER_FILE)
    load_scaler(accelerator.scaler, folder, accelerator.print)
    load_generators(folder / f"rng_state_{accelerator.process_index}.safetensors")


def save_scaler(scaler, folder: Path) -> None:
    """fp16's gradient scaler (Accelerate's, on a GPU; None otherwise): its loss scale and the count of steps since it
    last changed, as JSON. Resumed without them, a run would start again at the initial scale and skip the steps that
    overflow until the scale came back down."""
    if scaler is not None and scaler.is_enabled():
        (folder / SCALER_FILE).write_text(json.dumps(scaler.state_dict()), encoding="utf-8")


def load_scaler(scaler, folder: Path, say=print) -> None:
    if scaler is None or not scaler.is_enabled():
        return
    if (folder / SCALER_FILE).is_file():
        scaler.load_state_dict(json.loads((folder / SCALER_FILE).read_text(encoding="utf-8")))
    else:  # a run that trained in another precision, or an fp16 checkpoint older than scaler.json
        say(f"warning: {folder.name} holds no {SCALER_FILE}: fp16's loss scale starts again at {scaler.get_scale()}")


def save_optimizer(model, optimizer, file: Path, write: bool) -> None:
    """Every process calls this (under FSDP each holds a shard of the optimizer's state); with `write`, the full state
    goes to `file`: each parameter's state as "<parameter name>/<state name>" (Adam's moments and step), the numbers
    some optimizers keep (Adafactor's step) as tensors of one value named "...#number", the settings as JSON in the
    header."""
    full = get_optimizer_state_dict(model, _inner(optimizer),
                                    options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if write:  # one key in the header: safetensors orders its keys anew at each save, the same run the same bytes
        state = {f"{name}/{key}" + ("" if torch.is_tensor(value) else NUMBER): torch.as_tensor(value).contiguous()
                 for name, values in full["state"].items() for key, value in values.items()}
        save_file(state, file, metadata={"param_groups": json.dumps(full["param_groups"])})


def load_optimizer(model, optimizer, file: Path) -> None:
    with safe_open(str(file), framework="pt") as opened:
        metadata = opened.metadata()
    saved = load_file(file) | json.loads(metadata.get("numbers", "{}"))  # the numbers' header key of 2026-12-06
    state = {}
    for key, value in saved.items():
        name, entry = key.removesuffix(NUMBER).rsplit("/", 1)
        state.setdefault(name, {})[entry] = value.item() if key.endswith(NUMBER) else value
    groups = json.loads(metadata["param_groups"])
    if state:
        set_optimizer_state_dict(model, _inner(optimizer), {"state": state, "param_groups": groups},
                                 options=StateDictOptions(full_state_dict=True))
    else:  # Adam before its first update, plain SGD always: torch's loader wants a state; the settings alone (the lr)
        for group, settings in zip(_inner(optimizer).param_groups, groups, strict=True):
            group.update({key: value for key, value in settings.items() if key != "params"})
    for group in _inner(optimizer).param_groups:  # JSON gives a list where the optimizer made a tuple (Adam's betas)
        for key, default in _inner(optimizer).defaults.items():
            if isinstance(default, tuple):
                group[key] = tuple(group[key])


def save_generators(file: Path) -> None:
    """This process's random generators: torch's (the CPU's, the current GPU's), Python's and NumPy's."""
    version, words, gauss = random.getstate()
    _, keys, position, has_gauss, cached = np.random.get_state()
    tensors = {"cpu": torch.get_rng_state(), "python": torch.tensor(words), "numpy": torch.tensor(keys.tolist())}
    if torch.cuda.is_available():
        tensors["cuda"] = torch.cuda.get_rng_state()
    save_file(tensors, file, metadata={"generators": json.dumps(  # one key, as the optimizer's: the same bytes
        {"python": [version, gauss], "numpy": [position, has_gauss, cached]})})


def load_generators(file: Path) -> None:
    tensors = load_file(file)
    with safe_open(str(file), framework="pt") as opened:
        header = opened.metadata() or {}
    settings = json.loads(header["generators"]) if "generators" in header else {
        key: json.loads(value) for key, value in header.items()}  # a key each before 2026-12-06
    torch.set_rng_state(tensors["cpu"])
    if "cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["cuda"])
    if "python" in tensors:  # checkpoints before 2026-12-02 kept torch's alone
        version, gauss = settings["python"]
        random.setstate((version, tuple(tensors["python"].tolist()), gauss))
        position, has_gauss, cached = settings["numpy"]
        np.random.set_state(("MT19937", np.array(tensors["numpy"].tolist(), np.uint32), position, has_gauss, cached))


def _inner(optimizer):
    return getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds the torch optimizer


def _sha256(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def _fsync(path: Path) -> None:
    """Flush a file's or a folder's entries to the disk."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
