"""benchmarks/gpu_check.py, the GPU check, run at tiny sizes on the CPU: every line a GPU will run, before one is at
hand; and its checks, which must fail when the property they name breaks."""

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_check
from forked import run_launch_command
from gpu_check import PAIRED, checks, main, ratio, without_repository
from support import accelerate_as_in_a_new_process, commands_run_here, tf32_restored


@pytest.mark.long(minutes=1)
def test_the_gpu_check_runs_every_part_at_tiny_sizes_on_a_cpu(tmp_path, monkeypatch, capsys):
    """Two launches of training/run.py, a resume, a fresh process without vaswani_hf, both models side by side (parts
    1 and 2 in the check's own process, as --tiny runs them: their processes are the next test's). The check runs in
    this process, and each `accelerate launch` of run.py as the launcher runs it, forked (forked.py: the launcher
    itself runs in test_readme.py); the remote code's fresh process is a fresh process."""
    launches, fresh = [], subprocess.run

    def run(command, **kwargs):
        if command[:3] == [sys.executable, "-m", "accelerate.commands.launch"]:
            launches.append(command)
            return run_launch_command(command[3:], kwargs["env"], kwargs["timeout"])
        return fresh(command, **kwargs)

    monkeypatch.setattr(gpu_check.subprocess, "run", run)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main() sets it: restored after the test
    tf32_restored(monkeypatch)
    with accelerate_as_in_a_new_process():
        assert main(["--tiny", "--output_dir", str(tmp_path / "check")]) == 0, capsys.readouterr().err[-3000:]
    assert len(launches) == 2 and ["--resume_from_checkpoint" in command for command in launches] == [False, True]
    report = json.loads((tmp_path / "check" / "gpu_check.json").read_text(encoding="utf-8"))
    assert report["errors"] == {}
    assert report["checks"] == {"loss falls": True, "resumed run follows the first": True,
                                "compiled run's loss within 1% of the eager run's": True,
                                "remote code translates as vaswani-translate": True}
    assert report["training"]["resumed_identical"] and report["training"]["mixed_precision"] == "no"
    assert report["remote"]["equal"] == report["remote"]["sentences"] == 8
    for part, kinds in (("speed", ("bf16", "fp32")), ("decoding", ("greedy", "beam4"))):
        for kind in kinds:
            names = ("ours", "marian", "ours, fast_gpu") if part == "speed" else ("ours", "marian")
            assert all(report[part][kind][name]["tokens_per_second"] > 0 for name in names)
    assert report["decoding"]["gnmt"]["ours"]["tokens_per_second"] > 0
    assert report["speed"]["fused_attention"] == {"marian": "yes", "ours": "yes"}
    assert report["syncs"]["decoding step"] == {"marian": None, "ours": None}  # counted on a GPU only
    assert report["transforms"]["graph_breaks"] == 0
    assert set(report["transforms"]["bf16"]) == {"marian", "ours", "ours, ids unread", "ours, fast_gpu",
                                                 "ours, torch.compile", "marian, torch.compile"}
    assert all(report["profile"][name]["wall_ms"] > 0 for name in ("ours", "marian", "ours, fast_gpu"))
    assert set(report["loop"]) == {"bare", "padded", "run.py step", "run.py step, collated",
                                   "run.py step, collated, fast_gpu"}
    assert report["loop"]["bare"]["over_bare"] == 1.0 and report["loop"]["bare"]["host_waits"] is None
    table = (tmp_path / "check" / "gpu_check.md").read_text(encoding="utf-8")
    assert "| training tokens/s, bf16 autocast |" in table and table in capsys.readouterr().out
    assert "| training tokens/s, bf16 autocast (ours: fast_gpu) |" in table
    assert_targets_are_the_processes_ratios(report, 1)


def assert_targets_are_the_processes_ratios(report: dict, processes: int) -> None:
    """Each target of parts 1 and 2 is the median (of two, their mean) of the ratios of the processes' own figures."""
    for part, target, kind, name in (("speed", "training tokens/s, bf16", "bf16", "ours, fast_gpu"),
                                     ("decoding", "greedy tokens/s", "greedy", "ours"),
                                     ("decoding", "beam-4 tokens/s", "beam4", "ours")):
        runs = report[part].get("processes", [report[part]])
        assert len(runs) == processes
        assert report["targets"][target]["ours / marian"] == pytest.approx(sum(
            run[kind][name]["tokens_per_second"] / run[kind]["marian"]["tokens_per_second"]
            for run in runs) / processes)


def test_parts_1_and_2_in_two_processes_keep_each_ones_figures_and_give_their_medians(tmp_path, monkeypatch):
    """`--processes 2`, as a GPU runs three: parts 1 and 2 each in two processes, one after another, each
    `gpu_check.py --parts PART --processes 1 --tiny` in a folder of its own. Each figure is the median over the
    processes, ours / Marian the median of their ratios, and the table says so. Here each process's command runs
    in this process (main() with its arguments: the one-process part that the test above runs in a fresh one)."""
    commands = commands_run_here(monkeypatch, gpu_check)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main() sets it: restored after the test
    folder = tmp_path / "check"
    assert main(["--tiny", "--processes", "2", "--parts", "speed", "decoding", "--output_dir", str(folder)]) == 0
    assert commands == [["--parts", part, "--processes", "1", "--output_dir", str(folder / f"{part}-{index}"),
                         "--tiny"] for part in ("speed", "decoding") for index in (1, 2)]
    report = json.loads((folder / "gpu_check.json").read_text(encoding="utf-8"))
    assert report["errors"] == {}
    for part in PAIRED:
        runs = report[part]["processes"]
        assert runs == [json.loads((folder / f"{part}-{index}" / "gpu_check.json").read_text(encoding="utf-8"))[part]
                        for index in (1, 2)]
        for kind in PAIRED[part]:
            for name, figures in report[part][kind].items():
                assert figures == {key: pytest.approx((runs[0][kind][name][key] + runs[1][kind][name][key]) / 2)
                                   for key in figures}
        assert f"{part}: in 2 processes" in (folder / "gpu_check.md").read_text(encoding="utf-8")
    assert_targets_are_the_processes_ratios(report, 2)


def test_a_ratio_over_processes_is_the_median_of_their_ratios():
    """Each process sets both models' pace, so its own ratio is the paired figure. Here the median of the three
    ratios is 1.233, where the ratio of the medians (102 over 100), or their mean, would say otherwise."""
    runs = [{"bf16": {"marian": {"tokens_per_second": m}, "ours": {"tokens_per_second": o}}}
            for m, o in ((100.0, 102.0), (80.0, 99.0), (120.0, 148.0))]  # ratios 1.02, 1.2375, 1.2333
    assert ratio({"speed": {"processes": runs}}, "speed", "bf16") == pytest.approx(148 / 120)
    assert ratio({"speed": runs[1]}, "speed", "bf16") == pytest.approx(99 / 80)  # one process: its own ratio


def test_the_remote_check_leaves_only_the_repository_out_of_pythonpath():
    """The fresh process must not import vaswani_hf from the repository, but must keep the other entries: on the GPU
    machine, the carried wheels' folder."""
    environ = {"HOME": "/root", "PYTHONPATH": os.pathsep.join(["/tmp/site", str(ROOT), f"{ROOT}/."])}
    assert without_repository(environ) == {"HOME": "/root", "PYTHONPATH": "/tmp/site"}
    assert without_repository({"HOME": "/root", "PYTHONPATH": str(ROOT)}) == {"HOME": "/root"}
    assert without_repository({"HOME": "/root"}) == {"HOME": "/root"}


def test_too_few_processes_is_a_one_line_error_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="^error: --processes 0: parts 1 and 2 need at least one process$"):
        main(["--tiny", "--processes", "0", "--output_dir", str(tmp_path / "check")])
    assert not (tmp_path / "check").exists()


def test_fp16_without_a_cuda_gpu_is_a_one_line_error_before_any_work(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    refusal = "^error: --mixed_precision fp16 needs a CUDA GPU .run.py refuses it on a CPU.$"
    with pytest.raises(SystemExit, match=refusal):
        main(["--tiny", "--mixed_precision", "fp16", "--output_dir", str(tmp_path / "check")])
    assert not (tmp_path / "check").exists()


def test_the_training_part_reads_real_text_from_a_folder_in_multi30ks_layout(tmp_path):
    data = tmp_path / "text"
    data.mkdir()
    for name, pairs in (("train", 5), ("valid", 3), ("test2016", 3)):
        for lang in ("en", "de"):
            (data / f"{name}.{lang}").write_text("".join(f"{name} {lang} {i}\n" for i in range(pairs)),
                                                 encoding="utf-8")
    flags = gpu_check.write_pairs(tmp_path / "pairs", (4, 2, 3), str(data))
    assert flags == ["--train_file", str(tmp_path / "pairs" / "train"), "--validation_file",
                     str(tmp_path / "pairs" / "validation"), "--test_file", str(tmp_path / "pairs" / "test")]
    for split, name, pairs in (("train", "train", 4), ("validation", "valid", 2), ("test", "test2016", 3)):
        for lang in ("en", "de"):
            assert (tmp_path / "pairs" / f"{split}.{lang}").read_text(encoding="utf-8") == "".join(
                f"{name} {lang} {i}\n" for i in range(pairs))
    (data / "valid.de").unlink()
    with pytest.raises(SystemExit, match=f"^error: --training_data {data} lacks valid.de$"):
        main(["--tiny", "--training_data", str(data), "--output_dir", str(tmp_path / "check")])
    assert not (tmp_path / "check").exists()


def test_on_a_gpu_the_training_part_compares_the_compiled_run_with_an_eager_one_and_resumes_from_halfway(tmp_path,
                                                                                                       monkeypatch):
    """Part 4 as it runs on a GPU (issue 77: the compiled run's last loss within 1% of the eager run's), its three
    launches stood in for: the first run compiled by inductor, then the same flags with `--compile no` last, then the
    first resumed from its halfway checkpoint. Its figures against the runs' loss curves: the means of the first and
    last tenths, the eager run's last tenth, the resumed run's largest relative difference over the second half."""
    steps = 20
    first = [6.0 - 0.2 * step for step in range(steps)]
    curves = {"first": first, "eager": [loss * 1.005 for loss in first],
              "resumed": [loss * {15: 1.01, 18: 0.995}.get(step, 1.0) for step, loss in enumerate(first)]}
    launches = launches_stood_in(monkeypatch, curves)
    shape = {**gpu_check.SHAPES["tiny"], "steps": steps, "deterministic": False}
    found = gpu_check.training(torch.device("cuda"), shape, tmp_path)

    def value(flags, name):  # as argparse reads it: the last one given wins
        return flags[len(flags) - flags[::-1].index(name)] if name in flags else None

    assert [name for name, _ in launches] == ["run", "eager", "run"]
    assert [value(flags, "--compile") for _, flags in launches] == ["inductor", "no", "inductor"]
    assert [value(flags, "--resume_from_checkpoint") for _, flags in launches] == [
        None, None, str(tmp_path / "run" / "checkpoint-10")]
    assert value(launches[0][1], "--save_steps") == "10" and value(launches[0][1], "--max_steps") == "20"
    assert found["first_loss"] == pytest.approx((6.0 + 5.8) / 2)
    assert found["last_loss"] == pytest.approx((first[18] + first[19]) / 2)
    assert found["eager_last_loss"] == pytest.approx(1.005 * found["last_loss"])
    assert found["resumed_last_loss"] == pytest.approx((0.995 * first[18] + first[19]) / 2)
    assert found["resumed_max_relative_difference"] == pytest.approx(0.01)  # relative to the first run's loss
    assert found["resumed_identical"] is False  # the last losses equal, two before them not
    assert found["target_tokens_per_step"] == pytest.approx(sum(100 + step for step in range(steps)) / steps)
    assert checks({"training": found})["compiled run's loss within 1% of the eager run's"]
    assert not any("--deterministic" in flags or "--mixed_precision" in flags for _, flags in launches)
    launches.clear()
    gpu_check.training(torch.device("cuda"), {**shape, "deterministic": True}, tmp_path / "deterministic")
    assert len(launches) == 3 and all("--deterministic" in flags for _, flags in launches)
    launches.clear()
    gpu_check.training(torch.device("cuda"), {**shape, "mixed_precision": "fp16"}, tmp_path / "fp16")
    assert [value(flags, "--mixed_precision") for _, flags in launches] == ["fp16"] * 3


def launches_stood_in(monkeypatch, curves: dict) -> list:
    """gpu_check's launches of run.py stood in for: each returns the metrics of a run with the loss curve `curves`
    names for it (first, eager or resumed); the list fills with each launch's folder name and flags."""
    launches = []

    def launch(run, flags, timeout):
        name = "eager" if run.name == "eager" else "resumed" if "--resume_from_checkpoint" in flags else "first"
        launches.append((run.name, flags))
        history = [{"step": step + 1, "loss": loss, "tokens": 100 + step} for step, loss in enumerate(curves[name])]
        return {"seconds": 1.0, "metrics": {"history": history, "distributed": {"mixed_precision": "bf16"},
                                            "compiled_graphs": 3, "max_tokens": 0, "train_minutes": 0.5,
                                            "test": {"bleu": 20.0}}}

    monkeypatch.setattr(gpu_check, "launch", launch)
    return launches


@pytest.mark.parametrize("fall, status", [(0.1, 0), (0.01, 1)])
def test_the_command_fails_when_a_check_fails(tmp_path, monkeypatch, capsys, fall, status):
    """The training part's runs stood in for, their loss falling 0.1 a step (6.0 to 2.1 in the tiny shape's 40 steps)
    or 0.01 (to 5.61: less than LOSS_FALLS): the command's status is 1 when a check fails, though every part ran."""
    curve = [6.0 - fall * step for step in range(40)]
    launches_stood_in(monkeypatch, dict.fromkeys(("first", "eager", "resumed"), curve))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # main() sets it: restored after the test
    tf32_restored(monkeypatch)
    assert main(["--tiny", "--parts", "training", "--output_dir", str(tmp_path / "check")]) == status
    assert f"loss falls {'yes' if status == 0 else 'NO'}" in capsys.readouterr().out


TRAINED = {"first_loss": 6.0, "last_loss": 2.5, "eager_last_loss": 2.48, "resumed_max_relative_difference": 0.0,
           "resumed_identical": True, "mixed_precision": "fp16"}


def passing_report() -> dict:
    return {"shape": {"deterministic": True, "mixed_precision": "fp16"}, "training": TRAINED,
            "remote": {"sentences": 16, "equal": 16}}


@pytest.mark.parametrize("broken, failed", [
    ({"training": {**TRAINED, "last_loss": 5.5, "eager_last_loss": 5.5}}, "loss falls"),
    ({"training": {**TRAINED, "resumed_max_relative_difference": 0.05}}, "resumed run follows the first"),
    ({"training": {**TRAINED, "eager_last_loss": 2.45}}, "compiled run's loss within 1% of the eager run's"),
    ({"training": {**TRAINED, "eager_last_loss": 2.55}}, "compiled run's loss within 1% of the eager run's"),
    ({"remote": {"sentences": 16, "equal": 15}}, "remote code translates as vaswani-translate"),
    ({"training": {**TRAINED, "resumed_identical": False, "resumed_max_relative_difference": 1e-6}},
     "deterministic: the resumed run repeats the first's losses"),
    ({"training": {**TRAINED, "mixed_precision": "bf16"}}, "the runs trained in fp16"),
])
def test_each_check_fails_when_its_property_breaks(broken, failed):
    assert all(checks(passing_report()).values())
    found = checks({**passing_report(), **broken})
    assert [name for name, held in found.items() if not held] == [failed]


def test_each_wait_for_the_gpu_is_placed_where_the_step_made_it(monkeypatch):
    """The host's waits of a step (utilisation.py's `host_waits_at`): torch's sync debug mode warns at each wait, in
    the frame of the operation that waited; each warning of that kind, and no other, becomes one place, innermost
    frame first. Not the mode's own notice when it is first turned on, which mentions "synchronizing operations" too.
    (No GPU here: the debug mode's switch is stubbed and the warnings given as torch words them.)"""
    switched = []

    def switch(mode):  # torch's TORCH_WARN_ONCE: at the first switch of a process
        if not switched:
            warnings.warn("Synchronization debug mode is a prototype feature and does not yet detect all "
                          "synchronizing operations")
        switched.append(mode)

    monkeypatch.setattr(torch.cuda, "set_sync_debug_mode", switch)
    monkeypatch.setattr(gpu_check, "synchronize", lambda device: None)

    def waits_twice():
        warnings.warn("called a synchronizing CUDA operation")
        warnings.warn("something else")
        warnings.warn("called a synchronizing CUDA operation")

    places = gpu_check.sync_places(torch.device("cuda"), waits_twice)
    assert len(places) == 2 and places[0] != places[1]
    assert all(place.split(" < ")[0].startswith("test_gpu_check.py:") and " waits_twice" in place.split(" < ")[0]
               and " sync_places" in place.split(" < ")[1] for place in places)
    assert gpu_check.count_syncs(torch.device("cuda"), waits_twice) == 2
