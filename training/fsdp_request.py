"""What `accelerate launch` asked (its environment variables) of FSDP, DeepSpeed and torch.compile, and the one-line
refusal of what a run here cannot honour, said by one process. Standard library only: training/run.py checks before
it loads torch and transformers, so a launch that cannot be honoured stops in a moment in every process
(training/distributed.py does the sharding)."""

import os
import time
from contextlib import contextmanager

UNSUPPORTED = {  # Accelerate's FSDP settings (environment variables set by `accelerate launch`) we cannot honour
    "FSDP_OFFLOAD_PARAMS": "parameter offloading",
    "FSDP_ACTIVATION_CHECKPOINTING": "activation checkpointing",
}
# FSDP_CPU_RAM_EFFICIENT_LOADING (on by default in `accelerate launch`) concerns loading pretrained weights in one
# process; a run here builds its model from the seed in every process, so it has nothing to change.


def launcher_backend() -> str | None:
    """The torch.compile backend that `accelerate launch --dynamo_backend` (or `accelerate config`) names, or None
    (its default: no). training/run.py compiles its own step with it (training/step.py), and tells Accelerate no:
    Accelerate's compile of the whole model (torch.compile's defaults, not the step's symbolic sizes) would stand in
    for the step's."""
    named = os.environ.get("ACCELERATE_DYNAMO_BACKEND", "no").lower()
    return None if named == "no" else named


def fsdp_requested() -> bool:
    return os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true"


def deepspeed_requested() -> bool:
    return os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true"


def check_fsdp_request() -> None:
    """A one-line SystemExit for an FSDP request this run cannot honour, before any work (and before Accelerate,
    whose FSDP1 plugin fails on CPU processes with a traceback). DeepSpeed is refused: its engine would take over the
    step's backward, gradient accumulation and clipping, which the run does itself (training/step.py)."""
    if deepspeed_requested():
        refuse("error: DeepSpeed was asked for; training/run.py shards with FSDP2 (--use_fsdp --fsdp_version 2) or "
               "runs DDP: launch without --use_deepspeed")
    if not fsdp_requested():
        return
    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        refuse(f"error: FSDP version {version} was asked for; this run shards with FSDP2: add --fsdp_version 2")
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        refuse("error: FSDP with one process shards nothing: launch with --num_processes 2 or more")
    for variable, what in UNSUPPORTED.items():
        if os.environ.get(variable, "false").lower() == "true":
            refuse(f"error: FSDP {what} ({variable}) is not supported by training/run.py: leave it off")


def refuse(message: str) -> None:
    """Every process stops; only the first says why (two processes writing one line at once garble it). The others
    stop a second later: a launcher stops every process once one has ended, and the first may be slower to get there
    (a check after its own barrier, a busy core)."""
    if os.environ.get("RANK", "0") != "0":
        time.sleep(1)
        raise SystemExit(1)
    raise SystemExit(message)


@contextmanager
def said_once():
    """Around checks that every process makes alike (its flags, the output folder): a refusal (a SystemExit with a
    message) stops each process, and only the first says why, as `refuse` does."""
    try:
        yield
    except SystemExit as refusal:
        if isinstance(refusal.code, str):
            refuse(refusal.code)
        raise
