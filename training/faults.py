"""Fault injection, for the tests of what survives a kill: with VASWANI_FAULT=<point> in the environment, the
process kills itself with SIGKILL when it reaches that point (no cleanup runs, as with a real kill); with
VASWANI_FAULT=<point>:SIGTERM it sends itself a SIGTERM there instead (a preempted machine). Points: `step-N` (inside
optimizer step N, after the gradients, before the update), `save-N` (checkpoint N written but not yet complete),
`average` (the checkpoints averaged, the output folder not yet written)."""

import os
import signal


def fault_point(point: str) -> None:
    fault = os.environ.get("VASWANI_FAULT")
    if fault in (point, f"{point}:SIGTERM"):
        os.kill(os.getpid(), signal.SIGKILL if fault == point else signal.SIGTERM)
