"""benchmarks/utilisation.py, the GPU utilisation benchmark, run at tiny sizes on the CPU: every line a GPU will run
(but the compiler and the memory trials), before one is at hand."""

import json
import math
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

from support import accelerate_as_in_a_new_process, commands_run_here
from utilisation import EOS, gap_text, idle_gaps, main, marian, steady_gaps, summary, token_file, wmt_like_pairs

from vaswani_hf import VaswaniConfig


def test_the_benchmark_runs_at_tiny_sizes_and_counts_the_flops_the_formula_gives(tmp_path, monkeypatch, capsys):
    """run.py's step and MarianMTModel by Seq2SeqTrainer on the same WMT-like batches, in a process of their own:
    here the process's command (`utilisation.py ... --one tiny --output_dir FOLDER`) runs in this process, main()
    with its arguments. FlopCounterMode's count without attention's kernels (which torch 2.15 counts on a CPU too,
    2.13 not) must equal 6 x the weights each padded source and target token passes through, widths rounded up to 8
    (the benchmark's independent estimate). The host's seconds reading and padding a step are the timed steps' alone:
    the two warm-up steps' batches here take half a second each to read, the timed steps' a few milliseconds."""
    import utilisation

    class SlowToWarm(utilisation.EpochBatches):
        def step(self, step):
            if step < 2:
                time.sleep(0.5)
            return super().step(step)

    commands = commands_run_here(monkeypatch, utilisation)
    monkeypatch.setattr(utilisation, "device_name", lambda device: "NVIDIA H200")  # its peak: MFU's formula runs
    monkeypatch.setattr(utilisation, "EpochBatches", SlowToWarm)
    with accelerate_as_in_a_new_process():
        assert main(["--tiny", "--warmup", "2", "--steps", "2", "--pad_to_multiple_of", "8", "--output_dir",
                     str(tmp_path / "out")]) == 0
    folder = str(tmp_path / "out" / "tiny-1")  # one process for the one size
    assert [command[-4:] for command in commands] == [["--one", "tiny", "--output_dir", folder]]
    result = capsys.readouterr()
    tiny = json.loads((tmp_path / "out" / "utilisation.json").read_text(encoding="utf-8"))["sizes"]["tiny"]
    assert tiny["flops_per_step"] - tiny["attention_flops_per_step"] == tiny["estimated_flops_per_step"] > 0
    assert tiny["batches_per_step"] == 2 and tiny["steps"] == 2 and len(tiny["processes"]) == 1
    assert tiny["target_tokens_per_second"] > 0 and tiny["marian"]["target_tokens_per_second"] > 0
    assert tiny["over_marian"] == pytest.approx(
        tiny["target_tokens_per_second"] / tiny["marian"]["target_tokens_per_second"])
    assert tiny["compile"] == "no" and tiny["compiled_graphs"] == 0  # auto: eager on a CPU
    seconds = tiny["seconds_per_step"]
    assert tiny["target_tokens_per_second"] == pytest.approx(tiny["target_tokens_per_step"] / seconds)
    assert tiny["tflops_per_second"] == pytest.approx(tiny["flops_per_step"] / seconds / 1e12)
    assert tiny["mfu"] == pytest.approx(tiny["flops_per_step"] / seconds / 989e12)  # the H200's dense bf16 peak
    assert tiny["host_waits_per_step"] is None  # no GPU: no waits to count
    assert tiny["host_issue_seconds_per_step"] is None  # nor steps handed to a GPU
    assert tiny["host_data_seconds_per_step"] < 0.25
    assert tiny["recipe_hours"] == pytest.approx(100_000 * tiny["seconds_per_step"] / 3600)
    host = tiny["profile"]["top_host"]  # where a step's host time goes: the operators of most self time, in order
    assert len(host) == 8 and any(call["call"].startswith("aten::") for call in host)
    assert [call["ms"] for call in host] == sorted((call["ms"] for call in host), reverse=True)
    assert '"host_ms"' in result.out  # each process's figures printed as it ends
    table = (tmp_path / "out" / "utilisation.md").read_text(encoding="utf-8")
    assert "| tiny | 2 of <= 400 |" in table and table in result.out


def test_on_a_gpu_the_steady_profile_is_printed_as_each_process_ends_and_in_the_report(tmp_path, monkeypatch,
                                                                                        capsys):
    """The tiny run, its steady profile answered as on a GPU (the steps it profiles still run): the idle share in the
    process's line, the sentence with the longest gaps in utilisation.md."""
    import utilisation

    steady = {"steps": 5, "window_ms": 200.0, "kernel_ms": 165.0, "idle_share": 0.175, "gaps": 900,
              "back_to_back_ms": 12.3, "longest": [
        {"ms": 0.6, "after": "gemm", "before": "softmax", "launched_by": "aten::mm", "launched_ms_after_idle": 0.3}]}
    ran = []
    monkeypatch.setattr(utilisation, "steady_profile",
                        lambda device, queued, call, trace: (queued(), call(), ran.append(trace), steady)[-1])
    commands_run_here(monkeypatch, utilisation)
    with accelerate_as_in_a_new_process():
        assert main(["--tiny", "--warmup", "1", "--steps", "1", "--output_dir", str(tmp_path / "out")]) == 0
    assert ran == [tmp_path / "out" / "tiny-1" / "steady.json.gz"]
    assert '"steady_idle_share": 0.175' in capsys.readouterr().out
    table = (tmp_path / "out" / "utilisation.md").read_text(encoding="utf-8")
    assert ("tiny, 5 steps profiled as run.py makes them (process 1): kernels 165.0 ms of a 200.0-ms window, the GPU "
            "idle 17.5%, 12.3 ms of it in gaps under 20 µs (of 900); the longest: 0.60 ms after gemm") in table


def test_a_size_whose_process_fails_is_reported_and_the_benchmark_fails(tmp_path, capsys, monkeypatch):
    """A GPU's minutes are few: a process that fails (here every process, as a compiler error would) is reported with
    its error, the next size still runs, and the command fails."""
    import utilisation

    started = []

    def failing(command, **kwargs):
        started.append(command[command.index("--one") + 1])
        return subprocess.CompletedProcess(command, 1, "", "Traceback ...\nBackendCompilerFailed: inductor raised")

    monkeypatch.setattr(utilisation.subprocess, "run", failing)
    monkeypatch.setattr(utilisation.torch.cuda, "is_available", lambda: True)  # base and big, as on a GPU
    monkeypatch.setattr(utilisation, "device_name", lambda device: "a GPU")
    assert main(["--processes", "2", "--output_dir", str(tmp_path / "out")]) == 1
    report = json.loads((tmp_path / "out" / "utilisation.json").read_text(encoding="utf-8"))
    assert started == ["base", "big"] and report["sizes"] == {}
    assert list(report["errors"]) == ["base, process 1", "big, process 1"]
    assert "base, process 1 FAILED: BackendCompilerFailed: inductor raised" in capsys.readouterr().out


@pytest.mark.parametrize(("flags", "message"), [
    (["--steps", "0"], "error: --steps 0: must be at least 1"),
    (["--processes", "0"], "error: --processes 0: must be at least 1"),
    (["--compile", "inducer"], "error: --compile inducer: auto, no, or one of .*"),
])
def test_a_wrong_flag_is_one_line_before_any_work(tmp_path, flags, message):
    with pytest.raises(SystemExit, match=f"^{message}$"):
        main(["--tiny", *flags, "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_the_gpus_idle_time_is_its_window_less_the_union_of_its_kernels_in_the_gaps_between_them():
    """Kernels on several streams overlap: the busy time is the union of their intervals, each gap a stretch of the
    window from the first start to the last end that no kernel covers, begun by the kernel that ended last and ended
    by the next to start. Against a grid of microseconds, each marked by the kernels that cover it."""
    import random

    draw = random.Random(5)
    for _ in range(200):
        kernels = [(start, start + draw.randint(1, 9)) for start in (draw.randint(0, 60) for _ in range(draw.randint(
            1, 12)))]
        covered = [any(start <= t < end for start, end in kernels) for t in range(max(end for _, end in kernels))]
        busy, gaps = idle_gaps(kernels)
        first = min(start for start, _ in kernels)
        assert busy == sum(covered)
        idle = [t for t in range(first, len(covered)) if not covered[t]]
        assert sorted(t for start, end, _, _ in gaps for t in range(start, end)) == idle
        for start, end, before, after in gaps:
            assert kernels[before][1] == start and kernels[after][0] == end
    assert idle_gaps([(0, 4), (6, 8), (1, 5)]) == (7, [(5, 6, 2, 1)])  # the gap begins at the later of two ends


def test_a_gap_names_the_kernels_beside_it_and_the_operator_that_launched_the_next_one_and_when():
    """steady_profile's reading of torch.profiler's events (as FunctionEvent holds them: a kernel and the CUDA runtime
    call that launched it share a correlation id, and the call's parent is the host's operator): the longest gap
    first; the launch 0.3 ms after the GPU went idle, so the GPU waited for the host there."""
    from torch.autograd import DeviceType

    def event(name, device, start, end, id=0, parent=None):
        return SimpleNamespace(name=name, device_type=device, time_range=SimpleNamespace(start=start, end=end), id=id,
                               is_user_annotation=False, cpu_parent=parent)

    mm = event("aten::mm", DeviceType.CPU, 0, 2000)
    events = [mm, event("cudaLaunchKernel", DeviceType.CPU, 1500, 1510, 7, mm),
              event("cudaLaunchKernel", DeviceType.CPU, 100, 110, 6, None),
              event("gemm", DeviceType.CUDA, 200, 1200, 6), event("softmax", DeviceType.CUDA, 1800, 1900, 7),
              event("add", DeviceType.CUDA, 1950, 2000, 8), event("annotation", DeviceType.CUDA, 0, 3000, 9)]
    events[-1].is_user_annotation = True
    found = steady_gaps(events, top=2)
    assert gap_text(found["longest"][0]) == ("0.60 ms after gemm, before softmax (launched by aten::mm +0.30 ms from "
                                            "the idle's start)")
    assert found["window_ms"] == pytest.approx(1.8) and found["kernel_ms"] == pytest.approx(1.15)
    assert found["idle_share"] == pytest.approx(0.65 / 1.8) and found["gaps"] == 2
    assert found["back_to_back_ms"] == 0  # 600 and 50 µs: neither under 20 µs
    assert steady_gaps(events[:-2] + [event("add", DeviceType.CUDA, 1910, 2000, 8)], 2)["back_to_back_ms"] == \
        pytest.approx(0.01)
    assert found["longest"] == [
        {"ms": pytest.approx(0.6), "after": "gemm", "before": "softmax", "launched_by": "aten::mm",
         "launched_ms_after_idle": pytest.approx(0.3)},
        {"ms": pytest.approx(0.05), "after": "softmax", "before": "add", "launched_by": None,
         "launched_ms_after_idle": None}]


def test_three_processes_figures_are_their_medians_and_the_recipe_hours_and_targets_follow():
    """Each figure the median of the processes' own; ours / Marian the median of their ratios (1, 3, 5: 3, where the
    ratio of the medians is 2); big's recipe is §5.2's 300,000 steps, its MFU target 30%."""
    runs = [{"size": "big", "seconds_per_step": seconds, "mfu": mfu, "target_tokens_per_second": ours,
             "marian": {"target_tokens_per_second": peer}}
            for seconds, mfu, ours, peer in ((0.9, 0.29, 100, 100), (0.5, 0.35, 300, 100), (0.7, 0.31, 200, 40))]
    found = summary("big", runs)
    assert (found["seconds_per_step"], found["mfu"], found["target_tokens_per_second"]) == (0.7, 0.31, 200)
    assert found["over_marian"] == 3 and found["marian"]["target_tokens_per_second"] == 100
    assert found["recipe_hours"] == pytest.approx(300_000 * 0.7 / 3600) and found["processes"] == runs
    assert found["targets"] == {"mfu": {"target": 0.3, "met": True}, "over_marian": {"target": 2.0, "met": True}}
    assert summary("big", [{**run, "mfu": run["mfu"] - 0.05} for run in runs])["targets"]["mfu"]["met"] is False
    assert summary("big", [{**run, "mfu": 0.3} for run in runs])["targets"]["mfu"]["met"] is True  # at least 30%
    assert summary("base", runs)["recipe_hours"] == pytest.approx(100_000 * 0.7 / 3600)  # base: 100,000 steps


@pytest.mark.parametrize(("warmup", "expected"), [(2, (8 + 12) / 20), (0, (6 + 8 + 12) / 30)])
def test_marian_trains_as_ours_and_its_tokens_per_second_count_the_steps_after_its_warmup(tmp_path, monkeypatch,
                                                                                           warmup, expected):
    """Seq2SeqTrainer's steps timed at their ends (a clock here that reads 10 s more at each): with 2 warm-up steps
    of 4, the last 2 steps' target tokens over the 20 s from the warm-up's end; with none, the first step's end
    starts the clock. Each step's 2 batches are fed in order, accumulated into one step, with label smoothing 0.1."""
    import transformers
    import utilisation

    ends = iter(range(10, 1000, 10))
    monkeypatch.setattr(utilisation, "time", SimpleNamespace(perf_counter=lambda: float(next(ends))))
    trainers, fed = [], []

    class Seen(transformers.Seq2SeqTrainer):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            trainers.append(self)
            self.model.register_forward_pre_hook(lambda module, args, inputs: fed.append(inputs["input_ids"].tolist()),
                                                 with_kwargs=True)

    monkeypatch.setattr(transformers, "Seq2SeqTrainer", Seen)
    config = VaswaniConfig(vocab_size=40, d_model=16, d_ff=32, num_heads=2, num_layers=1, pad_token_id=0,
                           bos_token_id=1, eos_token_id=2, decoder_start_token_id=1)
    steps = [[([[5] * length + [2]], [[8] * length + [2]]), ([[6, 2]], [[9] * length + [2]])]
             for length in (1, 2, 3, 5)]
    found = marian("tiny", config, steps, 2, warmup, utilisation.torch.device("cpu"), tmp_path, 1)
    assert found == {"target_tokens_per_second": expected, "seconds_per_step": 10}  # steps of 4, 6, 8, 12 tokens
    assert fed == [sources for step in steps for sources, _ in step]
    assert trainers[0].args.gradient_accumulation_steps == 2 and trainers[0].args.label_smoothing_factor == 0.1


def test_the_pairs_are_as_long_as_wmt14s_and_their_ids_ordinary_tokens_ending_in_eos(tmp_path):
    """Lengths log-normal: exp(3.1 + 0.62^2 / 2) = 26.9 source tokens on average, a tail cut at 256 and reaching it,
    targets exp(0.08 + 0.2^2 / 2) = 1.105 times as long on average; in the token file each row of random ids of
    its length, none a special token (0-3), ending in </s>."""
    source, target = wmt_like_pairs(400_000, 37000)
    assert source.mean() == pytest.approx(math.exp(3.1 + 0.62**2 / 2), rel=0.01)
    assert source.min() >= 1 and target.min() >= 1 and source.max() == target.max() == 256
    assert (target / source).mean() == pytest.approx(math.exp(0.08 + 0.2**2 / 2), rel=0.01)
    rows = token_file(tmp_path, source[:50], target[:50], 40)
    for side, lengths in (("source", source[:50]), ("target", target[:50])):
        assert list(rows[f"{side}_length"]) == list(lengths)
        for ids, length in zip(rows[f"{side}_ids"], lengths, strict=True):
            assert len(ids) == length and ids[-1] == EOS and all(4 <= id < 40 for id in ids[:-1])


def test_the_benchmarks_scratch_folders_are_removed_when_their_process_ends():
    """What the benchmarks write for themselves (a run's token file, exports: hundreds of MB at the paper's sizes) goes
    to scratch folders; the process that made them removes them, files and all, when it ends."""
    code = ("from speed import scratch_folder\n"
            "for _ in range(2):\n    folder = scratch_folder()\n"
            "    open(f'{folder}/tokens.arrow', 'w').write('ids')\n    print(folder)")
    made = subprocess.run([sys.executable, "-c", code], cwd=ROOT / "benchmarks", capture_output=True, text=True,
                          check=True).stdout.split()
    assert len(made) == 2 and not any(Path(folder).exists() for folder in made)
