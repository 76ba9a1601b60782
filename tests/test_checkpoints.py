"""Checkpoints are written atomically: a kill during a save never damages the last good one."""

import pytest
import torch
from accelerate import Accelerator

from training.checkpoints import checkpoints, load_checkpoint, resolve_checkpoint, save_checkpoint
from vaswani_hf.kernels import KERNELS, VaswaniLinear


class Killed(BaseException):
    """Stands for SIGKILL arriving in the middle of a save."""


@pytest.fixture
def accelerator():
    accelerator = Accelerator(cpu=True)
    yield accelerator
    accelerator.free_memory()


def test_a_kill_during_a_save_leaves_the_previous_checkpoint_loadable(tmp_path, accelerator, monkeypatch):
    model = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model, optimizer = accelerator.prepare(model, optimizer)
    save_checkpoint(accelerator, tmp_path, 1, {"history": [1]}, keep=5)
    saved = {k: v.clone() for k, v in model.state_dict().items()}

    real_save_state = accelerator.save_state

    def save_state_then_die(directory):
        real_save_state(directory)  # the files are written ...
        raise Killed  # ... but the process dies before the checkpoint is complete

    with torch.no_grad():
        model.weight.add_(1.0)
    monkeypatch.setattr(accelerator, "save_state", save_state_then_die)
    with pytest.raises(Killed):
        save_checkpoint(accelerator, tmp_path, 2, {"history": [1, 2]}, keep=5)
    monkeypatch.undo()

    assert [p.name for p in checkpoints(tmp_path)] == ["checkpoint-1"]
    assert resolve_checkpoint(tmp_path, "latest").name == "checkpoint-1"
    state = load_checkpoint(accelerator, resolve_checkpoint(tmp_path, "latest"))
    assert state == {"step": 1, "history": [1]}
    for key, value in model.state_dict().items():
        assert torch.equal(value, saved[key])

    save_checkpoint(accelerator, tmp_path, 2, {"history": [1, 2]}, keep=1)  # the next save cleans up
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint-2"]


def test_resuming_from_nothing_is_a_one_line_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no complete checkpoint"):
        resolve_checkpoint(tmp_path, "latest")
    with pytest.raises(FileNotFoundError, match="not a complete checkpoint"):
        resolve_checkpoint(tmp_path, str(tmp_path / "checkpoint-9"))


def test_a_resumed_run_computes_with_the_kernels_its_checkpoint_recorded(tmp_path, accelerator, monkeypatch):
    """The choices a run measured go into its checkpoints; loading one takes them back and keeps them, so that a
    resumed run does not measure again (and perhaps choose otherwise) where the interrupted run had chosen."""
    monkeypatch.setattr(KERNELS, "chosen", {})
    monkeypatch.setattr(KERNELS, "forced", ())
    monkeypatch.setattr(KERNELS, "frozen", False)
    layer = VaswaniLinear(6, 5)
    layer, optimizer = accelerator.prepare(layer, torch.optim.Adam(layer.parameters()))
    layer(torch.randn(40, 6, requires_grad=True)).sum().backward()
    measured = dict(KERNELS.chosen)
    assert len(measured) == 3  # forward, input gradient, weight gradient
    save_checkpoint(accelerator, tmp_path, 1, {"history": []}, keep=1)

    monkeypatch.setattr(KERNELS, "chosen", {key: "not measured here" for key in measured})  # a fresh process
    state = load_checkpoint(accelerator, tmp_path / "checkpoint-1")
    assert KERNELS.chosen == measured and KERNELS.frozen and "kernels" not in state
