"""When a run stops, validates and saves, and the P_drop of its next step: one object per way of counting the run.

- `Steps`, the paper's (§5.3): --max_steps steps, validation every --eval_steps, a checkpoint every --save_steps or
  --save_minutes (unset: every 10 minutes, as the paper's were written, unless --save_steps is given).
- `Budgeted`, --max_train_minutes (training/budget.py): the run's length estimated from the measured step time
  before every step; it stops when the budget is spent, validates --evaluations times inside it and spreads the
  averaged checkpoints over its last share.
- `Replayed`, --replay_schedule: a budgeted run's record (schedule.json) followed instead of the clock, so that the
  same command gives the same weights on a machine of another speed.

run.py asks at every step, in this order: `next_step` before it, `dropout`, then `evaluate` and `save` after it,
with the run's clock read before and after it. What the schedule answered yes to is recorded in the checkpoint's
state and, for a budgeted run, in schedule.json.
"""

import sys

from tqdm.auto import tqdm

from training.budget import TimeBudget, crossed, fitted_dropout

PAPER_SAVE_MINUTES = 10  # §6.1: "averaging the last 5 checkpoints, which were written at 10-minute intervals"


class Steps:
    """The paper's schedule, counted in steps; `state` is the run's checkpoint state, fresh or resumed."""

    budget: TimeBudget | None = None  # the learning rate: §5.3's curve in steps

    def __init__(self, args, state: dict, steps_per_epoch: float, p_drop: float, validates: bool):
        self.args, self.state, self.steps_per_epoch, self.p_drop, self.validates = (
            args, state, steps_per_epoch, p_drop, validates)
        self.record = state.setdefault("schedule", {"expected_steps": [], "checkpoints": [], "evaluations": []})
        self.last_save = state.get("last_save_seconds", state["elapsed_seconds"])  # resumed: the last scheduled
        self.save_minutes = checkpoint_minutes(args)

    @property
    def expected(self) -> float:
        """The steps the run is expected to make."""
        return self.args.max_steps

    def next_step(self, step: int, elapsed: float) -> str | None:
        """Before step `step` + 1: None to make it, or why the run ends."""
        return f"--max_steps {self.args.max_steps}" if step >= self.args.max_steps else None

    def dropout(self) -> float | None:
        """P_drop of the next step, fitted to the run's expected epochs with --dropout_epochs; None: unchanged."""
        if not self.args.dropout_epochs:
            return None
        return fitted_dropout(self.expected / self.steps_per_epoch, self.p_drop, self.args.dropout_epochs)

    def evaluate(self, step: int, previous: float, elapsed: float) -> bool:
        """Whether to validate after step `step`, which the clock saw end at `elapsed` seconds (`previous`: the last
        step's end)."""
        if not self.validates:
            return False
        return self.recorded("evaluations", step, self.is_evaluation(step, previous, elapsed))

    def save(self, step: int, previous: float, elapsed: float) -> bool:
        """Whether to save a checkpoint after step `step`."""
        return self.recorded("checkpoints", step, self.is_checkpoint(step, previous, elapsed))

    def is_evaluation(self, step: int, previous: float, elapsed: float) -> bool:
        return bool(self.args.eval_steps) and step % self.args.eval_steps == 0

    def is_checkpoint(self, step: int, previous: float, elapsed: float) -> bool:
        every_minutes = self.save_minutes > 0 and elapsed - self.last_save > 60 * self.save_minutes
        return bool(self.args.save_steps) and step % self.args.save_steps == 0 or every_minutes

    def recorded(self, kind: str, step: int, yes: bool) -> bool:
        if yes:
            self.record[kind].append(step)
        return yes

    def saved(self, elapsed: float) -> None:
        """A checkpoint is written at `elapsed` seconds (--save_minutes counts from it, resumed too: a checkpoint
        written on SIGTERM, not the schedule's, leaves the count as it was)."""
        self.last_save = self.state["last_save_seconds"] = elapsed

    def progress(self, step: int, elapsed: float, disable: bool) -> tqdm:
        """A progress bar in steps, at `step`."""
        return tqdm(total=self.args.max_steps, initial=step, desc="training", **shown(disable))

    def position(self, step: int, elapsed: float) -> float:
        return step

    def written(self, step: int) -> dict | None:
        """What schedule.json records of a run that ended after `step` steps; None: no schedule.json."""
        return None


class Budgeted(Steps):
    """--max_train_minutes: the run fitted to the steps the machine is measured to make in the budget."""

    def __init__(self, args, state: dict, steps_per_epoch: float, p_drop: float, validates: bool,
                 budget: TimeBudget):
        super().__init__(args, state, steps_per_epoch, p_drop, validates)
        self.budget = budget

    @property
    def expected(self) -> float:
        return self.budget.expected

    def next_step(self, step: int, elapsed: float) -> str | None:
        if ended := super().next_step(step, elapsed) or self.spent(step, elapsed):
            return ended
        if step == 1:
            self.state["first_step_seconds"] = elapsed
        self.expect(step, elapsed)
        self.record["expected_steps"].append(self.budget.expected)
        return None

    def spent(self, step: int, elapsed: float) -> str | None:
        return f"the time budget of {self.args.max_train_minutes:g} minutes" if elapsed > self.budget.seconds else None

    def expect(self, step: int, elapsed: float) -> None:
        self.budget.estimate(step, elapsed, self.state.get("first_step_seconds", 0.0))

    def is_evaluation(self, step: int, previous: float, elapsed: float) -> bool:
        if not self.budget.evaluations:
            return super().is_evaluation(step, previous, elapsed)
        return crossed(previous, elapsed, self.budget.evaluation_interval()) and elapsed < self.budget.seconds

    def is_checkpoint(self, step: int, previous: float, elapsed: float) -> bool:
        if self.args.save_steps or self.args.save_minutes:
            return super().is_checkpoint(step, previous, elapsed)
        return crossed(previous, elapsed, self.budget.save_interval())

    def progress(self, step: int, elapsed: float, disable: bool) -> tqdm:
        """A progress bar in seconds of the budget; the steps made and expected beside it."""
        seconds = self.budget.seconds  # a finished run resumed is past its budget: the bar starts full
        return tqdm(total=round(seconds), initial=min(elapsed, round(seconds)),
                    desc=f"training, {seconds / 60:g}-minute budget",
                    bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total} s{postfix}", **shown(disable))

    def position(self, step: int, elapsed: float) -> float:
        return min(elapsed, self.budget.seconds)

    def written(self, step: int) -> dict:
        record = {**self.record, "steps": step, "warmup_steps": round(self.budget.warmup_share * self.expected)}
        return {key: record[key] for key in sorted(record)}


class Replayed(Budgeted):
    """--replay_schedule: a budgeted run's schedule.json followed step for step."""

    def __init__(self, args, state: dict, steps_per_epoch: float, p_drop: float, validates: bool,
                 budget: TimeBudget, replay: dict):
        super().__init__(args, state, steps_per_epoch, p_drop, validates, budget)
        self.replay = replay

    def spent(self, step: int, elapsed: float) -> str | None:
        return "the replayed schedule" if step == self.replay["steps"] else None  # the record's steps, not the clock

    def expect(self, step: int, elapsed: float) -> None:
        self.budget.expected = self.replay["expected_steps"][step]

    def is_evaluation(self, step: int, previous: float, elapsed: float) -> bool:
        return step in self.replay["evaluations"]

    def is_checkpoint(self, step: int, previous: float, elapsed: float) -> bool:
        return step in self.replay["checkpoints"]


def checkpoint_minutes(args) -> float:
    """The minutes between checkpoints by the clock (0: none): --save_minutes, or unset the paper's 10, unless
    --save_steps counts them instead."""
    if args.save_minutes is not None:
        return args.save_minutes
    return 0 if args.save_steps else PAPER_SAVE_MINUTES


def shown(disable: bool) -> dict:
    """A progress bar's refresh: every second on a terminal, every 30 s in a log file."""
    return {"disable": disable, "mininterval": 1 if sys.stderr.isatty() else 30}
