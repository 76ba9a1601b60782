"""A run fitted to a wall-clock budget (`--max_train_minutes`): an option of ours, not the paper's.

The paper counts its schedule in steps (§5.3: 4,000 warmup steps of 100,000) because it knew how many steps it
would make. Under a time budget the number of steps is the machine's: a CPU twice as slow makes half the steps, and
a warmup of fixed length would fill twice the share of its run. So with a budget, every length is a share of the
run the machine is expected to make, estimated from the measured step time and re-estimated at every step:

- the learning rate keeps the §5.3 shape and its peak (the peak of the §5.3 curve for `--warmup_steps`, times
  `--lr_scale`): a linear warmup over `warmup_share` of the expected steps, then the decay in 1/sqrt(step);
  `cooldown_share` > 0 adds a linear decay to zero over the last share of the expected steps;
- the averaged checkpoints (§6.1) are spread evenly over the last `average_share` of the budget;
- validation runs `evaluations` times, evenly spaced inside the run;
- with `dropout_epochs` (E0, E1), P_drop is fitted to the epochs the run is expected to make (`fitted_dropout`).

Without a budget none of this applies and the recipe is the paper's, in steps; `dropout_epochs`, if given, then
fits P_drop to the epochs of --max_steps.

What a budgeted run fitted depends on the machine's speed at the time. So it writes the schedule it followed to
`schedule.json` in its folder: the expected steps as estimated before each step (from which the learning rate and
P_drop follow), the steps after which it saved a checkpoint and validated, and its last step. The same command with
`--replay_schedule FOLDER/schedule.json` follows that record instead of the clock, and gives the same weights.
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from training.distributed import unwrap


def budget_lr(step: int, expected_steps: float, peak: float, warmup_share: float, cooldown_share: float = 0.0
              ) -> float:
    """The learning rate of optimizer step `step` (1-based) in a run expected to make `expected_steps` steps."""
    warmup = max(1.0, warmup_share * expected_steps)
    rate = peak * min(step / warmup, math.sqrt(warmup / step))
    if cooldown_share > 0:
        rate *= min(1.0, max(0.0, (expected_steps - step) / (cooldown_share * expected_steps)))
    return rate


def fitted_dropout(expected_epochs: float, p_drop: float, epochs: tuple[float, float]) -> float:
    """P_drop for a run expected to make `expected_epochs` passes over its training data: none up to `epochs[0]`
    (a short run underfits, and dropout slows it further), rising linearly to `p_drop` at `epochs[1]` and beyond
    (a long run overfits without it)."""
    start, full = epochs
    return p_drop * min(1.0, max(0.0, (expected_epochs - start) / (full - start)))


def set_dropout(model, p_drop: float) -> None:
    """P_drop of the residual and embedding dropouts (§5.4), the modules named `dropout`, and in the config that
    config.json saves; nothing to do when it is already `p_drop` (run.py calls this at every step)."""
    config = unwrap(model).config
    if config.dropout == p_drop:
        return
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] == "dropout" and isinstance(module, torch.nn.Dropout):
            module.p = p_drop
    config.dropout = p_drop


def crossed(previous: float, now: float, interval: float) -> bool:
    """Whether a multiple of `interval` seconds lies in (previous, now]."""
    return math.floor(now / interval) > math.floor(previous / interval)


@dataclass
class TimeBudget:
    seconds: float
    max_steps: int
    peak: float  # the learning rate at the end of the warmup
    warmup_steps: int  # the warmup's length until a step time is known
    warmup_share: float
    cooldown_share: float
    average_share: float
    checkpoints: int
    evaluations: int

    def __post_init__(self):
        for name in ("warmup_share", "cooldown_share", "average_share"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"--{name} {getattr(self, name)}: a share of the run, between 0 and 1")
        if self.seconds <= 0:
            raise ValueError(f"--max_train_minutes {self.seconds / 60}: must be positive")
        # the steps this run is expected to make, as last estimated
        first_guess = self.warmup_steps / self.warmup_share if self.warmup_share else self.max_steps
        self.expected = min(self.max_steps, first_guess)

    def estimate(self, step: int, elapsed: float, first_step_seconds: float) -> float:
        """Steps done plus the steps the remaining time allows at the mean time of the steps after the first (the
        first warms up torch's allocator and kernels); checkpoints count in that time, validations do not (run.py's
        clock stops for them). At most --max_steps. Before two steps are done, the previous estimate stands."""
        if step >= 2:
            per_step = max((elapsed - first_step_seconds) / (step - 1), 1e-9)
            self.expected = min(self.max_steps, step + max(0.0, self.seconds - elapsed) / per_step)
        return self.expected

    def learning_rate(self, step: int) -> float:
        return budget_lr(step, self.expected, self.peak, self.warmup_share, self.cooldown_share)

    def save_interval(self) -> float:
        """Seconds between checkpoints: the last `checkpoints` of them span the last `average_share` of the run."""
        return self.average_share * self.seconds / max(self.checkpoints, 1)

    def evaluation_interval(self) -> float:
        """Seconds between validations: `evaluations` of them, evenly spaced inside the run."""
        return self.seconds / (self.evaluations + 1) if self.evaluations else math.inf


def read_schedule(path: str) -> dict:
    """A budgeted run's schedule.json; a missing or unreadable one is a one-line SystemExit."""
    try:
        schedule = json.loads(Path(path).read_text(encoding="utf-8"))
        if not (len(schedule["expected_steps"]) >= schedule["steps"] >= 1 and isinstance(schedule["checkpoints"], list)
                and isinstance(schedule["evaluations"], list)):
            raise ValueError("its steps, expected_steps, checkpoints and evaluations do not agree")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(f"error: --replay_schedule {path}: not a run's schedule.json ({error})") from None
    return schedule
