"""Checkpoints that survive a kill (§5.2/§6.1: the paper wrote one every 10 minutes and averaged the last few).

A checkpoint is a folder `checkpoint-<step>` holding Accelerate's state (model weights as safetensors,
optimizer, learning-rate schedule, every process's RNG states) and `trainer_state.json` (the step, the run's
history, and the CPU kernels the run chose by measurement). It is written under a temporary name and renamed into
place when complete, so a kill during a save leaves the previous checkpoints untouched and never produces a
half-written `checkpoint-<step>`.

Kernels (vaswani_hf/kernels.py) give the same products with different rounding, which Adam can amplify in
parameters whose gradient is rounding noise. So a run measures its kernels during its first step, every process
then takes the main process's choices and keeps them (`share_kernel_choices`), and a run resumed on a CPU of the
same name computes with the choices its checkpoint recorded.
"""

import json
import os
import re
import shutil
from pathlib import Path

from accelerate.utils import broadcast_object_list

from vaswani_hf.kernels import KERNELS

CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
STATE_FILE = "trainer_state.json"
WEIGHTS_FILE = "model.safetensors"


def checkpoints(output_dir: str | Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    output_dir = Path(output_dir)
    if not output_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in output_dir.iterdir() if (m := CHECKPOINT.match(p.name)) and (p / STATE_FILE).is_file()]
    return [path for _, path in sorted(found)]


def resolve_checkpoint(output_dir: str | Path, name: str) -> Path:
    """`latest` -> the newest complete checkpoint of output_dir; otherwise a checkpoint folder path."""
    if name == "latest":
        found = checkpoints(output_dir)
        if not found:
            raise FileNotFoundError(f"--resume_from_checkpoint latest: no complete checkpoint in {output_dir}")
        return found[-1]
    path = Path(name)
    if not (path / STATE_FILE).is_file():
        raise FileNotFoundError(f"--resume_from_checkpoint {name}: not a complete checkpoint (no {STATE_FILE})")
    return path


def save_checkpoint(accelerator, output_dir: str | Path, step: int, state: dict, keep: int) -> Path:
    """Every process calls this. Writes checkpoint-<step> atomically and keeps the newest `keep` checkpoints."""
    output_dir = Path(output_dir)
    final = output_dir / f"checkpoint-{step}"
    temporary = output_dir / f".incomplete-checkpoint-{step}"
    if accelerator.is_main_process:
        shutil.rmtree(temporary, ignore_errors=True)  # left by a run killed while saving
        temporary.mkdir(parents=True)
    accelerator.wait_for_everyone()
    accelerator.save_state(str(temporary))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        with open(temporary / STATE_FILE, "w") as file:
            json.dump({"step": step, **state, "kernels": KERNELS.state_dict()}, file, indent=1)
            file.flush()
            os.fsync(file.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.replace(temporary, final)
        for old in checkpoints(output_dir)[:-keep] if keep > 0 else []:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()
    return final


def load_checkpoint(accelerator, path: Path) -> dict:
    """Restores model, optimizer, schedule, RNG states and kernel choices; returns trainer_state.json."""
    accelerator.load_state(str(path))
    state = json.loads((path / STATE_FILE).read_text())
    kernels = state.pop("kernels", None)
    if kernels and KERNELS.load_state_dict(kernels):
        KERNELS.freeze()
    elif kernels and kernels["chosen"]:
        accelerator.print(f"the checkpoint's kernels were measured on {kernels['cpu']}: measuring them again here")
    return state


def share_kernel_choices() -> None:
    """After a run's first step, on every process: take the main process's kernel choices and keep them."""
    KERNELS.load_state_dict(broadcast_object_list([KERNELS.state_dict()])[0])
    KERNELS.freeze()
