"""Checkpoints are written atomically: a kill during a save never damages the last good one; a checkpoint damaged
later is found when read; resuming loads data, never a pickle."""

import argparse
import errno
import json
import os
import pickle
import random
import shutil
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import Accelerator
from forked import run_forked, torch_ranks
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file
from support import accelerate_as_in_a_new_process, tiny_model

import vaswani_hf
from training import checkpoints as checkpoints_module
from training.averaging import averaged_model
from training.checkpoints import (
    checkpoints,
    damage,
    leave_timeline,
    load_checkpoint,
    load_generators,
    load_optimizer,
    load_training_state,
    resolve_checkpoint,
    save_checkpoint,
    save_generators,
    save_optimizer,
    verified,
)


class Killed(BaseException):
    """Stands for SIGKILL arriving in the middle of a save."""


@pytest.fixture
def accelerator():
    """An Accelerator for the test, its process-wide state cleared after: a test that runs next in this process with
    another mixed precision (training/run.py's bf16) would otherwise be refused by Accelerate."""
    with accelerate_as_in_a_new_process():
        accelerator = Accelerator(cpu=True)
        yield accelerator
        accelerator.free_memory()


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, accelerator, monkeypatch):
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    save_checkpoint(accelerator, model, optimizer, tmp_path, 1, {"history": [1]}, keep=5)
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    real_save = checkpoints_module.save_training_state

    def save_then_die(*args):
        real_save(*args)  # the files are written ...
        raise Killed  # ... but the process dies before the checkpoint is complete

    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(1.0)
    monkeypatch.setattr(checkpoints_module, "save_training_state", save_then_die)
    with pytest.raises(Killed):
        save_checkpoint(accelerator, model, optimizer, tmp_path, 2, {"history": [1, 2]}, keep=5)
    monkeypatch.undo()

    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-1"]
    assert resolve_checkpoint(tmp_path, "latest").name == "checkpoint-1"
    state = load_checkpoint(accelerator, model, optimizer, resolve_checkpoint(tmp_path, "latest"))
    assert state == {"step": 1, "history": [1]}
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key])

    save_checkpoint(accelerator, model, optimizer, tmp_path, 2, {"history": [1, 2]}, keep=1)  # the next save cleans up
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-2"]


def test_only_a_write_the_disk_refuses_is_told_apart_from_other_errors():
    """Full, over quota or read-only (an OSError's number, or safetensors' words for it) is the disk's; a missing
    file, a permission or a bug is not, and is raised as it is."""
    from vaswani_hf.tools.text import refused_write

    for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
        assert refused_write(OSError(code, os.strerror(code)))
        serializing = f"Error while serializing: I/O error: {os.strerror(code)} (os error {code})"
        assert refused_write(SafetensorError(serializing))
    for other in (OSError(errno.EACCES, "Permission denied"), FileNotFoundError(errno.ENOENT, "No such file"),
                  SafetensorError("Error while serializing: I/O error: Permission denied (os error 13)"),
                  ValueError("No space left on device (os error 28)")):
        assert not refused_write(other), other


def test_a_process_whose_peer_ended_stops_in_one_line(tmp_path):
    """Two processes of a gloo group: the first ends (as a run that said its error does) while the second waits in a
    barrier. The second says in one line that another process ended first, with no traceback of gloo's."""
    script = tmp_path / "peer.py"
    script.write_text(textwrap.dedent("""
        import os
        import torch.distributed as dist
        from training.checkpoints import stopped_in_one_line

        @stopped_in_one_line()
        def main():
            dist.init_process_group("gloo")
            dist.barrier()  # both have joined (an end while joining is also logged by c10d itself)
            if dist.get_rank() == 0:
                os._exit(0)
            dist.barrier()

        main()
        """), encoding="utf-8")
    ended = run_forked([], torch_ranks(2), timeout=120, script=script)
    assert (ended.returncode, ended.stdout) == (1, "")
    assert ended.stderr == "error: process 1 stopped: another process of the run ended first\n"


def test_a_runs_stop_is_said_once_and_only_a_peers_end_or_a_refused_write_becomes_one_line(monkeypatch, capsys):
    """`stopped_in_one_line`: gloo's words for either end of a closed connection in a process of a distributed run are
    a peer's end, and in a lone process (no RANK: a download's reset, ...) the error as it is; a write the disk refuses
    anywhere in the run is one line; Ctrl-C is said by the first process alone, each ending with a SIGINT's status."""
    from training.checkpoints import stopped_in_one_line

    def stopped(error: BaseException) -> str | int:
        with pytest.raises(SystemExit) as stop, stopped_in_one_line():
            raise error
        return stop.value.code

    monkeypatch.setenv("RANK", "1")
    for words in ("Connection closed by peer", "Connection reset by peer"):
        said = stopped(RuntimeError(f"[gloo] {words}"))
        assert said == "error: process 1 stopped: another process of the run ended first"
    assert (stopped(KeyboardInterrupt()), capsys.readouterr().err) == (130, "")
    monkeypatch.delenv("RANK")
    assert stopped(KeyboardInterrupt()) == 130 and "--resume_from_checkpoint latest" in capsys.readouterr().err
    with pytest.raises(RuntimeError, match="^Connection reset by peer$"), stopped_in_one_line():
        raise RuntimeError("Connection reset by peer")
    full = OSError(errno.ENOSPC, "No space left on device", "metrics.json")
    assert stopped(full) == "error: [Errno 28] No space left on device: 'metrics.json'"


def test_resuming_from_nothing_is_a_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no intact checkpoint"):
        resolve_checkpoint(tmp_path, "latest")
    with pytest.raises(FileNotFoundError, match="no intact checkpoint"):
        resolve_checkpoint(tmp_path / "never-made", "latest")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_checkpoint(tmp_path, str(tmp_path / "checkpoint-9"))


def saved_run(tmp_path, accelerator, steps):
    """Checkpoints of a small model and Adam at the given steps, each with weights that tell the step."""
    model = tiny_model()
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters()))
    for step in steps:
        with torch.no_grad():
            for parameter in model.parameters():
                parameter.fill_(step)
        save_checkpoint(accelerator, model, optimizer, tmp_path, step, {"history": list(range(step))}, keep=10)
    return model, optimizer


def truncate(path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_latest_falls_back_to_the_newest_intact_checkpoint_with_one_warning(tmp_path, accelerator):
    model, optimizer = saved_run(tmp_path, accelerator, [2, 4, 6])
    truncate(tmp_path / "checkpoint-6" / "model.safetensors")
    adam = tmp_path / "checkpoint-4" / "optimizer.safetensors"
    adam.write_bytes(b"x" * adam.stat().st_size)
    warnings = []
    assert resolve_checkpoint(tmp_path, "latest", warnings.append).name == "checkpoint-2"
    size = (tmp_path / "checkpoint-6" / "model.safetensors").stat().st_size
    assert warnings == [
        (f"warning: checkpoint-6 is damaged (model.safetensors has {size} bytes, {2 * size} were written): "
         "trying the one before it"),
        ("warning: checkpoint-4 is damaged (optimizer.safetensors does not hold what was written (SHA-256 differs)): "
         "trying the one before it")]
    assert load_checkpoint(accelerator, model, optimizer, resolve_checkpoint(tmp_path, "latest", print))["step"] == 2
    assert all(torch.all(parameter == 2) for parameter in model.parameters())
    with pytest.raises(FileNotFoundError, match="checkpoint-6: damaged"):
        resolve_checkpoint(tmp_path, str(tmp_path / "checkpoint-6"))
    # Averaging reads only the weights: checkpoint-4's are intact, checkpoint-6's are not.
    said = []
    assert [p.name for p in verified(checkpoints(tmp_path), said.append, only=("model.safetensors",))] == [
        "checkpoint-2", "checkpoint-4"]
    assert len(said) == 1 and said[0].startswith("warning: checkpoint-6 is damaged")
    (tmp_path / "checkpoint-4" / "notes.txt").write_text("a file beside the weights is no reason to leave them out",
                                                         encoding="utf-8")
    assert [p.name for p in verified(checkpoints(tmp_path), said.append, only=("model.safetensors",))] == [
        "checkpoint-2", "checkpoint-4"]
    # The run's end, with the weights of every checkpoint damaged: nothing to average, said in one line.
    for step in (2, 4):
        truncate(tmp_path / f"checkpoint-{step}" / "model.safetensors")
    with pytest.raises(SystemExit) as stop:
        averaged_model(tmp_path, None, 5, said.append)
    assert stop.value.code == f"error: every checkpoint in {tmp_path} is damaged: nothing to average"


def test_the_final_model_averages_the_last_intact_checkpoints_and_refuses_weights_that_do_not_fit(tmp_path,
                                                                                                    accelerator):
    """§6.1's average of the last 2, checkpoint-6's weights damaged: checkpoint-2's and -4's (weights 3), not -4's
    alone; a model of another depth than the checkpoints' is refused, one with fewer layers and one with more."""
    from support import tiny_config

    saved_run(tmp_path, accelerator, [2, 4, 6])
    truncate(tmp_path / "checkpoint-6" / "model.safetensors")
    said = []
    final, averaged = averaged_model(tmp_path, tiny_config(), 2, said.append)
    assert [p.name for p in averaged] == ["checkpoint-2", "checkpoint-4"] and len(said) == 1
    assert all(torch.all(parameter == 3) for parameter in final.parameters())
    assert final.lm_head.weight is final.model.encoder.embed_tokens.weight  # §3.4's one matrix
    layers = tiny_config().num_layers
    for other, what in ((layers + 1, "missing"), (layers - 1, "unexpected")):
        with pytest.raises(RuntimeError, match=rf"^averaged checkpoints do not fit the model: .*{what} \['model"):
            averaged_model(tmp_path, tiny_config(num_layers=other), 2, said.append)


def test_a_missing_file_or_state_is_damage(tmp_path, accelerator):
    """A state that is not JSON, or JSON without the files it lists, is damage: resuming says so, and does not call
    the folder the Trainer's (whose trainer_state.json has no files either)."""
    saved_run(tmp_path, accelerator, [1, 2, 3])
    (tmp_path / "checkpoint-2" / "model.safetensors").unlink()
    assert damage(tmp_path / "checkpoint-2") == "model.safetensors is missing"
    for step, state in ((1, "{ not json"), (3, json.dumps({"step": 3})), (3, "[3]")):
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text(state, encoding="utf-8")
        assert damage(tmp_path / f"checkpoint-{step}") == "trainer_state.json is missing or unreadable"
        with pytest.raises(FileNotFoundError, match=rf"^--resume_from_checkpoint \S+checkpoint-{step}: damaged "
                                                    r"\(trainer_state.json is missing or unreadable\)$"):
            resolve_checkpoint(tmp_path, str(tmp_path / f"checkpoint-{step}"))


def test_only_folders_named_checkpoint_and_a_step_holding_a_state_are_checkpoints_and_ordered_by_step(
        tmp_path, accelerator):
    """checkpoint-10 is newer than checkpoint-9; a copy named checkpoint-9-old, or a checkpoint-11 that holds no
    trainer_state.json (not written by a save), is none, and a save of step 11 replaces that folder."""
    model, optimizer = saved_run(tmp_path, accelerator, [9, 10])
    shutil.copytree(tmp_path / "checkpoint-9", tmp_path / "checkpoint-9-old")
    (tmp_path / "checkpoint-11").mkdir()
    (tmp_path / "checkpoint-11" / "model.safetensors").write_bytes(b"half")
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-9", "checkpoint-10"]
    assert resolve_checkpoint(tmp_path, "latest").name == "checkpoint-10"
    save_checkpoint(accelerator, model, optimizer, tmp_path, 11, {"history": []}, keep=2)
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-11"]
    assert damage(tmp_path / "checkpoint-11") is None


def test_a_file_the_run_did_not_write_is_damage_in_a_subfolder_too(tmp_path, accelerator):
    saved_run(tmp_path, accelerator, [1])
    (tmp_path / "checkpoint-1" / "extra").mkdir()
    (tmp_path / "checkpoint-1" / "extra" / "payload.bin").write_bytes(b"planted")
    assert damage(tmp_path / "checkpoint-1") == "holds extra/payload.bin, which the run did not write"


def test_a_save_removes_every_incomplete_checkpoint_and_records_every_file(tmp_path, accelerator):
    (tmp_path / ".incomplete-checkpoint-7" / "sub").mkdir(parents=True)
    (tmp_path / ".incomplete-checkpoint-3").mkdir()
    saved_run(tmp_path, accelerator, [5])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5"]
    recorded = json.loads((tmp_path / "checkpoint-5" / "trainer_state.json").read_text(encoding="utf-8"))["files"]
    written = (p.name for p in (tmp_path / "checkpoint-5").iterdir() if p.name != "trainer_state.json")
    assert sorted(recorded) == sorted(written)


def test_every_file_and_folder_of_a_checkpoint_reaches_the_disk_before_the_rename_and_the_rename_after(
        tmp_path, accelerator, monkeypatch):
    """What a power cut cannot take: each file of the checkpoint and its folder are fsynced before the folder is
    renamed into place, and the output folder (which holds the rename) after."""
    synced, renamed = [], []
    fsync, replace = os.fsync, os.replace
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda *pair: renamed.append((len(synced), *map(str, pair))) or replace(*pair))
    saved_run(tmp_path, accelerator, [1])
    final, temporary = tmp_path / "checkpoint-1", tmp_path / ".incomplete-checkpoint-1"
    [(at, source)] = [(at, source) for at, source, target in renamed if target == str(final)]
    assert source == str(temporary)
    assert {str(temporary / p.relative_to(final)) for p in final.rglob("*")} | {source} <= set(synced[:at])
    assert str(tmp_path) in synced[at:]


def test_resuming_unpickles_no_object(tmp_path, accelerator):
    """A checkpoint folder is data (safetensors and JSON; beside them the model's code as save_pretrained copies it,
    the package's own files): a planted pickle beside the files is never run, and one in place of a file the run wrote
    is refused as damaged and, read anyway, is not a safetensors file."""
    model, optimizer = saved_run(tmp_path, accelerator, [1])
    written = sorted((tmp_path / "checkpoint-1").iterdir())
    assert [p.name for p in written if not p.name.endswith(".py")] == [
        "config.json", "generation_config.json", "model.safetensors", "optimizer.safetensors",
        "rng_state_0.safetensors", "trainer_state.json"]
    package = Path(vaswani_hf.__file__).parent
    for code in (p for p in written if p.name.endswith(".py")):
        assert code.read_text(encoding="utf-8") == (package / code.name).read_text(encoding="utf-8")
    marker = tmp_path / "ran"

    class Payload:
        def __reduce__(self):
            return (os.mkdir, (str(marker),))

    for name in ("custom_checkpoint_0.pkl", "scheduler.bin"):
        (tmp_path / "checkpoint-1" / name).write_bytes(pickle.dumps(Payload()))
    assert damage(tmp_path / "checkpoint-1") == "holds custom_checkpoint_0.pkl, which the run did not write"
    with pytest.raises(FileNotFoundError, match="checkpoint-1: damaged .holds custom_checkpoint_0.pkl"):
        resolve_checkpoint(tmp_path, str(tmp_path / "checkpoint-1"))
    for name in ("custom_checkpoint_0.pkl", "scheduler.bin"):
        (tmp_path / "checkpoint-1" / name).unlink()
    load_checkpoint(accelerator, model, optimizer, tmp_path / "checkpoint-1")  # the files the run wrote
    torch.save({"state": Payload()}, tmp_path / "checkpoint-1" / "optimizer.safetensors")
    assert "optimizer.safetensors" in damage(tmp_path / "checkpoint-1")
    with pytest.raises(SafetensorError):
        load_training_state(accelerator, model, optimizer, tmp_path / "checkpoint-1")
    assert not marker.exists()


def test_a_checkpoint_keeps_every_random_generator_a_step_may_draw_from(tmp_path):
    """torch's, Python's and NumPy's generators (a collator or a user's callback may draw from the last two): after a
    load each gives again what it gave after the save, Python's pending Gaussian too."""
    torch.manual_seed(3), random.seed(3), np.random.seed(3)
    random.gauss(0, 1), np.random.standard_normal()  # each holds the second of a pair of Gaussians
    save_generators(tmp_path / "generators.safetensors")

    def draws():
        return torch.rand(4).tolist(), [random.random(), random.gauss(0, 1)], np.random.standard_normal(3).tolist()

    first = draws()
    load_generators(tmp_path / "generators.safetensors")
    assert draws() == first
    # One key in the header (safetensors orders a header's keys anew at each save: the same run, the same bytes); the
    # key each of Python and NumPy of checkpoints before 2026-12-06 still loads.
    with safe_open(str(tmp_path / "generators.safetensors"), framework="pt") as opened:
        header, tensors = opened.metadata(), {key: opened.get_tensor(key) for key in opened.keys()}  # noqa: SIM118
    assert list(header) == ["generators"]
    save_file(tensors, tmp_path / "two_keys.safetensors",
              metadata={key: json.dumps(value) for key, value in json.loads(header["generators"]).items()})
    load_generators(tmp_path / "two_keys.safetensors")
    assert draws() == first
    # A checkpoint written before 2026-12-02 kept torch's generator alone: it loads, and leaves the others as they are.
    save_file({"cpu": torch.get_rng_state()}, tmp_path / "torch_only.safetensors")
    after = random.getstate(), np.random.get_state()[1].tolist()
    load_generators(tmp_path / "torch_only.safetensors")
    assert (random.getstate(), np.random.get_state()[1].tolist()) == after


def test_a_checkpoint_keeps_fp16s_loss_scale_and_resuming_restores_it(tmp_path, accelerator, capsys):
    """fp16 training (a GPU's; a CPU GradScaler stands in for Accelerate's) scales its loss by a factor that backs off
    at an overflow and grows after `growth_interval` clean steps: a checkpoint keeps the factor and the count as JSON,
    recorded as its other files are, and resuming restores both into the run's new scaler. A checkpoint without them
    (a run in another precision) loads with one warning line, the scale at its start."""
    state = {"scale": 96.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 7, "_growth_tracker": 3}
    accelerator.scaler = torch.amp.GradScaler("cpu")
    accelerator.scaler.load_state_dict(state)
    model, optimizer = saved_run(tmp_path, accelerator, [1])
    assert json.loads((tmp_path / "checkpoint-1" / "scaler.json").read_text(encoding="utf-8")) == state
    assert "scaler.json" in json.loads((tmp_path / "checkpoint-1" / "trainer_state.json").read_bytes())["files"]
    accelerator.scaler = torch.amp.GradScaler("cpu")
    load_checkpoint(accelerator, model, optimizer, tmp_path / "checkpoint-1")
    assert accelerator.scaler.state_dict() == state
    accelerator.scaler = None  # bf16 or float32
    saved_run(tmp_path, accelerator, [2])
    assert not (tmp_path / "checkpoint-2" / "scaler.json").exists()
    accelerator.scaler = torch.amp.GradScaler("cpu")
    capsys.readouterr()
    load_checkpoint(accelerator, model, optimizer, tmp_path / "checkpoint-2")
    assert capsys.readouterr().out == ("warning: checkpoint-2 holds no scaler.json: fp16's loss scale starts again at "
                                       "65536.0\n")
    assert accelerator.scaler.state_dict()["scale"] == 65536.0


def test_resuming_from_an_older_checkpoint_moves_its_successors_out_of_the_run(tmp_path, accelerator):
    model, optimizer = saved_run(tmp_path, accelerator, [2, 4, 6])
    moved = leave_timeline(tmp_path / "checkpoint-2")
    assert [p.name for p in moved] == ["abandoned-checkpoint-4", "abandoned-checkpoint-6"]
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-2"]
    save_checkpoint(accelerator, model, optimizer, tmp_path, 3, {"history": []}, keep=2)  # one timeline
    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-2", "checkpoint-3"]
    assert (tmp_path / "abandoned-checkpoint-6" / "model.safetensors").is_file()  # kept, not deleted
    saved_run(tmp_path, accelerator, [4])  # the run reaches step 4 again, and is resumed from step 2 again
    assert [p.name for p in leave_timeline(tmp_path / "checkpoint-2")] == ["abandoned-checkpoint-3",
                                                                           "abandoned-checkpoint-4"]
    assert json.loads((tmp_path / "abandoned-checkpoint-4" / "trainer_state.json").read_bytes())["history"] == [
        0, 1, 2, 3]  # the newer step 4 (saved_run's history), in place of the older one


def test_adams_settings_and_moments_come_back_as_saved(tmp_path, accelerator):
    """The paper's β2 = 0.98 and ε = 1e-9, and the moments after a step, restored into an Adam made with torch's
    defaults. Its file's header holds one key: safetensors orders a header's keys anew at each save, and the same run
    writes the same bytes (test_training_run.py's replay compares them; with a second key it failed one run in
    three)."""
    model = tiny_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-4, betas=(0.9, 0.98), eps=1e-9)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(input_ids=torch.tensor([[5, 6, 2]]), labels=torch.tensor([[7, 2]])).loss.backward()
    optimizer.step()
    save_checkpoint(accelerator, model, optimizer, tmp_path, 1, {"history": []}, keep=1)
    with safe_open(str(tmp_path / "checkpoint-1" / "optimizer.safetensors"), framework="pt") as opened:
        assert list(opened.metadata()) == ["param_groups"]
    fresh = tiny_model()
    fresh, defaults = accelerator.prepare(fresh, torch.optim.Adam(fresh.parameters()))
    load_checkpoint(accelerator, fresh, defaults, tmp_path / "checkpoint-1")
    settings = ("lr", "betas", "eps", "weight_decay", "amsgrad")
    assert [{k: g[k] for k in settings} for g in defaults.param_groups] == [
        {k: g[k] for k in settings} for g in optimizer.param_groups]
    assert defaults.param_groups[0]["betas"] == (0.9, 0.98)
    for saved, loaded in zip(optimizer.param_groups[0]["params"], defaults.param_groups[0]["params"]):
        for key in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[saved][key], defaults.state[loaded][key])


def test_an_optimizers_numbers_come_back_as_numbers_from_one_header_key(tmp_path, accelerator):
    """transformers' Adafactor keeps its step as a Python number: saved as a tensor of one value, it comes back an int,
    and the file's header holds one key, as Adam's does. A file of 2026-12-06, its numbers in a header key of their
    own, still loads."""
    from transformers.optimization import Adafactor

    model = tiny_model()
    optimizer = Adafactor(model.parameters(), lr=1e-3, relative_step=False, scale_parameter=False)
    model, optimizer = accelerator.prepare(model, optimizer)
    model(input_ids=torch.tensor([[5, 6, 2]]), labels=torch.tensor([[7, 2]])).loss.backward()
    optimizer.step()
    file = tmp_path / "optimizer.safetensors"
    save_optimizer(model, optimizer, file, write=True)
    with safe_open(str(file), framework="pt") as opened:
        header, tensors = opened.metadata(), {key: opened.get_tensor(key) for key in opened.keys()}  # noqa: SIM118
    assert list(header) == ["param_groups"]
    numbers = {key.removesuffix("#number"): value.item() for key, value in tensors.items() if key.endswith("#number")}
    save_file({key: value for key, value in tensors.items() if not key.endswith("#number")},
              tmp_path / "numbers_header.safetensors", metadata={**header, "numbers": json.dumps(numbers)})
    for saved in (file, tmp_path / "numbers_header.safetensors"):
        fresh = tiny_model()
        fresh, loaded = accelerator.prepare(fresh, Adafactor(fresh.parameters(), lr=1e-3, relative_step=False,
                                                             scale_parameter=False))
        load_optimizer(fresh, loaded, saved)
        steps = [loaded.state[p]["step"] for p in loaded.param_groups[0]["params"]]
        assert steps == [1] * len(steps) and all(type(step) is int for step in steps), saved.name
        for before, after in zip(optimizer.param_groups[0]["params"], loaded.param_groups[0]["params"]):
            for key, value in optimizer.state[before].items():
                assert torch.equal(torch.as_tensor(value), torch.as_tensor(loaded.state[after][key])), key


def test_a_resumed_run_computes_with_its_checkpoints_plan_and_a_new_run_with_the_kept_one(tmp_path, accelerator,
                                                                                         monkeypatch):
    """fast_cpu's plan (training in oneDNN or not) is the run's: a resumed run takes its checkpoint's, not what is
    kept for the machine now; a new run takes the kept one, measured with the run's random state left alone."""
    from support import tiny_config

    import training.run as run_module

    kept = {"greedy": {"packed": False}, "beam": {"shared": True, "packed": True}, "training": {"onednn": True}}
    monkeypatch.setattr(run_module, "fast_cpu", lambda model: setattr(model, "fast_cpu_plan", kept) or model)
    torch.manual_seed(0)
    expected = torch.rand(2)
    torch.manual_seed(0)
    assert run_module.run_plan(accelerator, tiny_config(), None) == kept
    assert torch.equal(torch.rand(2), expected)  # the probe model's initial weights were not the run's draws
    saved = {**kept, "training": {"onednn": False}}
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"fast_cpu_plan": saved}),
                                                                  encoding="utf-8")
    assert run_module.run_plan(accelerator, tiny_config(), tmp_path / "checkpoint-2") == saved


def test_max_tokens_0_is_a_resumed_runs_own_and_on_a_cpu_4096_and_a_given_number_is_kept(tmp_path, accelerator):
    """--max_tokens 0 asks the run to choose its batches' size: a resumed run keeps the one it chose (its checkpoint
    says), a new run on a CPU takes 4,096 (on a GPU, the largest that fits: training/step.py)."""
    import training.run as run_module

    args = argparse.Namespace(max_tokens=0, tokens_per_step=25000, cudnn_attention=False)
    (tmp_path / "checkpoint-2").mkdir()
    (tmp_path / "checkpoint-2" / "trainer_state.json").write_text(json.dumps({"max_tokens": 1234}), encoding="utf-8")
    assert run_module.batch_tokens(accelerator, None, None, args, max_length=256) == 4096
    assert run_module.batch_tokens(accelerator, None, tmp_path / "checkpoint-2", args, max_length=256) == 1234
    args.max_tokens = 500
    assert run_module.batch_tokens(accelerator, None, tmp_path / "checkpoint-2", args, max_length=256) == 500


def test_a_resumed_run_goes_on_at_its_step_its_learning_rate_and_its_clock(tmp_path, accelerator):
    """A run saved after 3 steps and 500 s, resumed in a new Run: step 3, the learning rate of step 4, a clock that
    reads on from 500 s (a budgeted run spends what is left of its minutes, not a new budget), and the batch size the
    resumed run chose (a new --max_tokens), which its own checkpoints keep for the next resume."""
    import training.run as run_module
    from training.schedule import paper_optimizer

    def new_run(max_tokens=400):
        model = tiny_model()
        optimizer, scheduler = paper_optimizer(model, 24, warmup_steps=4)
        model, optimizer = accelerator.prepare(model, optimizer)
        return run_module.Run(accelerator, model, optimizer, scheduler, None, None,
                              argparse.Namespace(average_checkpoints=2), tmp_path, None, False,
                              {"history": [], "elapsed_seconds": 0.0, "max_tokens": max_tokens, "fast_cpu_plan": None})

    first = new_run()
    for _ in range(3):
        first.optimizer.step()
        first.scheduler.step()
    first.save(3, 500.0)
    resumed = new_run(max_tokens=500)
    assert resumed.resume(tmp_path / "checkpoint-3") == 3 and resumed.state["max_tokens"] == 500
    assert 500 <= resumed.seconds() < 560
    assert resumed.scheduler.get_last_lr() == first.scheduler.get_last_lr() != new_run().scheduler.get_last_lr()
