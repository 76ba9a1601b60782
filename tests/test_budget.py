"""A run fitted to a time budget (training/budget.py): its schedule as a function of the budget and the step time,
and the paper's schedule untouched without one; the schedule objects of each mode (training/schedules.py)."""

import math
from types import SimpleNamespace

import pytest
import torch

from training.budget import TimeBudget, budget_lr, crossed, fitted_dropout
from training.schedule import inverse_sqrt_lr, paper_optimizer
from training.schedules import Budgeted, Replayed, Steps

PEAK = 1e-3


def make_budget(minutes=25, max_steps=100000, warmup_share=0.1, cooldown_share=0.0, average_share=0.3,
                checkpoints=15, evaluations=5):
    return TimeBudget(60 * minutes, max_steps, PEAK, 400, warmup_share, cooldown_share, average_share, checkpoints,
                      evaluations)


def test_the_budget_curve_is_the_papers_when_its_warmup_is_the_papers():
    # expected 100k steps, 4% warmup = the paper's 4,000; the peak of the §5.3 curve for 4,000
    peak = inverse_sqrt_lr(4000, 512)
    for step in (1, 7, 3999, 4000, 4001, 55555, 100000):
        assert budget_lr(step, 100000, peak, 0.04) == pytest.approx(inverse_sqrt_lr(step, 512), rel=1e-12)


@pytest.mark.parametrize("expected_steps", [1000, 2000, 4000])
def test_warmup_and_cooldown_are_shares_of_the_expected_run(expected_steps):
    warmup = 0.1 * expected_steps
    rates = [budget_lr(s, expected_steps, PEAK, 0.1, 0.3) for s in range(1, expected_steps + 1)]
    assert max(rates) == pytest.approx(PEAK) and rates.index(max(rates)) + 1 == warmup  # the peak ends the warmup
    assert rates[0] == pytest.approx(PEAK / warmup)                                       # linear from step 1
    middle = int(0.5 * expected_steps)                                         # §5.3 decay, before cooldown
    assert rates[middle - 1] == pytest.approx(PEAK * math.sqrt(warmup / middle))
    start = 0.7 * expected_steps                                                           # cooldown: linear to 0
    late = int(0.9 * expected_steps)
    cooldown = (expected_steps - late) / (expected_steps - start)
    assert rates[late - 1] == pytest.approx(PEAK * math.sqrt(warmup / late) * cooldown)
    assert rates[-1] == 0.0
    assert budget_lr(expected_steps + 5, expected_steps, PEAK, 0.1, 0.3) == 0.0  # past the end: 0, not below


@pytest.mark.parametrize("warmup_share", [0.0, 0.0001])
def test_a_warmup_shorter_than_a_step_starts_at_the_peak_and_decays_from_it(warmup_share):
    """--warmup_share 0 (or a share of under one step): no ramp, the §5.3 decay from step 1, peak · step^-0.5."""
    rates = [budget_lr(step, 1000, PEAK, warmup_share) for step in (1, 4, 100)]
    assert rates == pytest.approx([PEAK, PEAK / 2, PEAK / 10])


def test_a_machine_half_as_fast_expects_half_the_steps_and_warms_up_for_half_as_many():
    fast, slow = make_budget(), make_budget()
    # 100 steps done; the first took 20 s (it measures kernels), the others 0.5 s or 1 s each
    assert fast.estimate(100, 20 + 99 * 0.5, 20) == pytest.approx(100 + (1500 - 69.5) / 0.5)
    assert slow.estimate(100, 20 + 99 * 1.0, 20) == pytest.approx(100 + (1500 - 119) / 1.0)
    assert fast.expected / slow.expected == pytest.approx(2, rel=0.05)
    step = 100  # both are warming up: the slow one is further along its shorter warmup
    assert slow.learning_rate(step) / fast.learning_rate(step) == pytest.approx(fast.expected / slow.expected)


def test_the_estimate_follows_the_step_time_as_it_changes():
    budget = make_budget()
    budget.estimate(101, 10 + 100 * 0.5, 10)
    before = budget.expected
    budget.estimate(201, 10 + 100 * 0.5 + 100 * 1.5, 10)  # the machine got slower: mean step time 1 s
    assert budget.expected == pytest.approx(201 + (1500 - 210) / 1.0) and budget.expected < before


def test_before_two_steps_the_warmup_is_warmup_steps_long_and_max_steps_caps_the_estimate():
    budget = make_budget(warmup_share=0.1)
    assert budget.estimate(1, 30.0, 30.0) == 4000  # warmup_steps 400 / share 0.1
    assert budget.learning_rate(1) == pytest.approx(PEAK / 400)
    capped = make_budget(max_steps=250)
    assert capped.estimate(50, 60, 10) == 250
    late = make_budget(minutes=1)
    assert late.estimate(50, 75, 10) == 50  # past the budget: the steps done, not fewer


def test_checkpoints_span_the_last_share_and_evaluations_are_spread_over_the_budget():
    budget = make_budget(minutes=25, average_share=0.3, checkpoints=15, evaluations=5)
    assert budget.save_interval() == pytest.approx(30.0)   # 15 checkpoints over the last 7.5 of 25 minutes
    assert budget.evaluation_interval() == pytest.approx(250.0)  # 5 inside the run, the last at 20:50
    saves = [t for t in range(1, 1501) if crossed(t - 1, t, budget.save_interval())]
    assert len(saves) == 50 and saves[-15:][0] == 1080  # the last 15: from 72% of the budget on
    assert not crossed(29.0, 29.9, 30.0) and crossed(29.9, 30.0, 30.0) and crossed(0, 95, 30.0)
    assert not crossed(0, 1e9, make_budget(evaluations=0).evaluation_interval())


@pytest.mark.parametrize("name, value", [("warmup_share", 1.5), ("cooldown_share", -0.1), ("average_share", 2)])
def test_a_share_outside_0_1_is_refused_naming_the_flag(name, value):
    with pytest.raises(ValueError, match=f"--{name} {value}: a share of the run, between 0 and 1"):
        make_budget(**{name: value})


def test_a_budget_of_no_time_is_refused():
    with pytest.raises(ValueError, match=r"^--max_train_minutes 0.0: must be positive$"):
        make_budget(minutes=0)


def test_the_optimizer_follows_the_budget_and_without_one_the_paper():
    model = torch.nn.Linear(3, 3)
    budget = make_budget()
    optimizer, scheduler = paper_optimizer(model, d_model=512, warmup_steps=400, budget=budget)
    rates = []
    for step in range(1, 4):
        rates.append(optimizer.param_groups[0]["lr"])
        budget.estimate(step, 10.0 + step, 10.0)  # what run.py does before each step
        optimizer.step()
        scheduler.step()
    assert rates[0] == pytest.approx(PEAK / 400)
    assert rates[2] == pytest.approx(budget_lr(3, 2 + (1500 - 12.0) / 2.0, PEAK, 0.1))  # 2 s for step 2
    plain, _ = paper_optimizer(torch.nn.Linear(3, 3), d_model=512, warmup_steps=400)
    assert plain.param_groups[0]["lr"] == pytest.approx(inverse_sqrt_lr(1, 512, 400), rel=1e-12)


@pytest.mark.parametrize("epochs, p_drop", [(0, 0), (4, 0), (10, 0), (15, 0.025), (20, 0.05), (29, 0.095), (30, 0.1),
                                            (300, 0.1)])
def test_dropout_fitted_to_the_run_is_none_up_to_e0_linear_to_p_drop_at_e1_and_p_drop_beyond(epochs, p_drop):
    assert fitted_dropout(epochs, 0.1, (10, 30)) == pytest.approx(p_drop, abs=1e-15)


# --- the schedule objects run.py asks at every step (training/schedules.py) --------------------------------------

def schedule_args(**flags):
    defaults = {"max_steps": 1000, "eval_steps": 0, "save_steps": 0, "save_minutes": 0, "dropout_epochs": None,
                "max_train_minutes": 25}
    return SimpleNamespace(**{**defaults, **flags}), {"elapsed_seconds": 0.0}


def asked(schedule, clock):
    """What `schedule` answers as run.py asks it, the clock at `clock(step)` after each step: the step it ended
    at and why, the steps validated and saved."""
    step, previous, evaluated, saved = 0, 0.0, [], []
    while not (ended := schedule.next_step(step, previous)):
        step += 1
        if schedule.evaluate(step, previous, clock(step)):
            evaluated.append(step)
        if schedule.save(step, previous, clock(step)):
            saved.append(step)
            schedule.saved(clock(step))
        previous = clock(step)
    return step, ended, evaluated, saved


def test_the_papers_schedule_counts_steps_and_minutes_between_checkpoints():
    args, state = schedule_args(max_steps=12, eval_steps=5, save_steps=4, save_minutes=1)
    assert asked(Steps(args, state, 3, 0.1, True), lambda step: 25.0 * step) == (
        12, "--max_steps 12", [5, 10], [3, 4, 7, 8, 11, 12])  # multiples of 4, and > 60 s after the last checkpoint
    assert asked(Steps(args, {"elapsed_seconds": 0.0}, 3, 0.1, False), lambda step: 0.0)[2] == []  # no validation set
    bar = Steps(args, state, 3, 0.1, True).progress(5, 125.0, disable=True)  # resumed after step 5
    assert (bar.n, bar.total) == (5, 12)


def test_the_papers_checkpoints_come_every_10_minutes_unless_save_steps_or_save_minutes_say_otherwise():
    """§6.1's checkpoints were "written at 10-minute intervals": run.py's defaults save once 600 s have passed since
    the last; --save_steps alone counts steps instead; --save_minutes 0 saves none before the last step."""
    from training.arguments import RecipeArguments

    def saved(**flags):
        return asked(Steps(RecipeArguments(max_steps=20, **flags), {"elapsed_seconds": 0.0}, 3, 0.1, True),
                     lambda step: 100.0 * step)[3]

    assert saved() == [7, 14] and saved(save_steps=10) == [10, 20] and saved(save_minutes=0) == []


def test_a_budget_ends_with_its_minutes_validates_inside_them_and_saves_in_its_last_share():
    args, state = schedule_args(max_train_minutes=25)
    budget = make_budget(minutes=25, average_share=0.3, checkpoints=15, evaluations=5)
    step, ended, evaluated, saved = asked(Budgeted(args, state, 3, 0.1, True, budget), lambda step: 10.0 * step)
    assert (step, ended) == (151, "the time budget of 25 minutes")  # 1,510 s > 1,500 s
    assert evaluated == [25, 50, 75, 100, 125] and len(saved) == 50 and saved[-15] == 108  # 1,080 s: 72% on
    assert state["schedule"]["evaluations"] == evaluated and state["schedule"]["checkpoints"] == saved
    assert len(state["schedule"]["expected_steps"]) == step


def test_a_budget_leaves_the_first_step_out_of_its_estimate_and_stops_at_the_first_step_past_its_end():
    """The first step takes 103 s (torch warms up), the others 7 s: from step 2 on, the run expects 2 + (1,500 -
    110) / 7 steps; the step that ends at 1,503 s is its last. With --evaluations 0, --eval_steps counts."""
    args, state = schedule_args(max_train_minutes=25, eval_steps=50)
    budget = make_budget(minutes=25, evaluations=0)
    schedule = Budgeted(args, state, 3, 0.1, True, budget)
    step, ended, evaluated, _ = asked(schedule, lambda step: 96.0 + 7 * step)
    assert (step, ended) == (201, "the time budget of 25 minutes") and state["first_step_seconds"] == 103
    assert schedule.position(step, 1503.0) == 1500  # the bar's end
    assert state["schedule"]["expected_steps"][2:] == pytest.approx([2 + 1390 / 7] * 199)
    assert evaluated == [50, 100, 150, 200]


def test_a_budget_ends_at_max_steps_if_they_come_first_and_saves_as_save_minutes_say():
    """--max_steps bounds a budgeted run too; --save_minutes (or --save_steps) replaces the budget's checkpoints."""
    args, state = schedule_args(max_train_minutes=25, max_steps=300, save_minutes=1)
    budget = make_budget(minutes=25, evaluations=0)
    step, ended, _, saved = asked(Budgeted(args, state, 3, 0.1, True, budget), lambda step: 2.0 * step)
    assert (step, ended) == (300, "--max_steps 300") and saved[:3] == [31, 62, 93]  # > 60 s after the last


@pytest.mark.parametrize("state", [{"elapsed_seconds": 600.0}, {"elapsed_seconds": 630.0, "last_save_seconds": 600.0}])
def test_a_resumed_run_counts_its_save_minutes_from_its_last_scheduled_checkpoint(state):
    """Resumed at 600 s (its last checkpoint), --save_minutes 1 saves once 60 s have passed since, not at once.
    Resumed at 630 s from a checkpoint written on SIGTERM (training/checkpoints.py), it counts from the last one the
    schedule wrote, at 600 s, as the run would have without the SIGTERM."""
    args, _ = schedule_args(save_minutes=1)
    # A copy of the parameter: the schedule writes the seconds of its checkpoints into the state.
    schedule, saved, previous = Steps(args, dict(state), 3, 0.1, True), [], state["elapsed_seconds"]
    for step, now in zip(range(5, 10), (630.0, 659.0, 661.0, 700.0, 720.0)):
        if now <= previous:  # before the SIGTERM
            continue
        if schedule.save(step, previous, now):
            saved.append(step)
            schedule.saved(now)
        previous = now
    assert saved == [7]


def test_a_budget_resumed_after_its_end_shows_a_full_bar_without_a_warning(recwarn, capsys):
    """A finished run resumed starts past its budget (its end is redone: the model written again); the bar, shown,
    draws 100% and tqdm warns of nothing; hidden (the processes other than the first), it draws nothing."""
    args, state = schedule_args(max_train_minutes=4)
    bar = Budgeted(args, state, 3, 0.1, True, make_budget(minutes=4)).progress(987, 240.4, disable=False)
    bar.close()
    assert (bar.n, bar.total) == (240, 240) and [str(w.message) for w in recwarn.list] == []
    assert Budgeted(args, state, 3, 0.1, True, make_budget(minutes=4)).progress(0, 0.0, disable=True).disable
    assert "100%" in capsys.readouterr().err


def test_a_replayed_schedule_follows_its_record_and_not_the_clock():
    record = {"steps": 6, "expected_steps": [40, 40, 30, 30, 20, 20, 20], "checkpoints": [2, 6], "evaluations": [3]}
    args, state = schedule_args(dropout_epochs=[1, 3])
    schedule = Replayed(args, state, 10, 0.1, True, make_budget(minutes=1e-6), record)
    assert asked(schedule, lambda step: 1e9 * step) == (6, "the replayed schedule", [3], [2, 6])
    assert schedule.expected == 20 and schedule.dropout() == pytest.approx(0.05)  # 2 expected epochs of 10 steps
    written = schedule.written(6)  # schedule.json, its keys in order
    assert written == {**record, "expected_steps": record["expected_steps"][:6], "warmup_steps": 2}
    assert list(written) == sorted(written)


def test_a_progress_bar_refreshes_every_second_on_a_terminal_and_every_30_seconds_in_a_log(monkeypatch):
    import sys

    from training.schedules import shown

    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    assert shown(False) == {"disable": False, "mininterval": 1}
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False)
    assert shown(True) == {"disable": True, "mininterval": 30}
