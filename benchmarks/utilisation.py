"""How much of a GPU training/run.py's step uses: the paper's batch, base and big, bf16, against MarianMTModel trained
by Seq2SeqTrainer on the same batches.

    python benchmarks/utilisation.py --output_dir runs/mfu                    # on a GPU: base and big, 3 processes
    python benchmarks/utilisation.py --sizes base --processes 1 --output_dir runs/mfu-base
    python benchmarks/utilisation.py --tiny --output_dir runs/mfu-tiny        # on a CPU: tiny sizes, the same code

Data: synthetic token pairs with lengths drawn like WMT14 EN-DE's under a 37,000-token BPE (log-normal, mean about 27
tokens, a tail to 256; targets about 10% longer), written as training/run.py writes its tokens (an Arrow file of
`source_ids`, `target_ids` and lengths) and batched by its `EpochBatches` at the paper's 25,000 tokens a step.

Each size, in each of `--processes` fresh processes (ours / Marian is the median of their ratios):

1. ours: run.py's step as run.py runs it on a GPU — its batches, collation, `TrainingStep` (compiled by inductor on a
   GPU unless `--compile no`, as run.py; SDPA without cuDNN's kernels unless `--cudnn_attention`, as run.py; nothing
   read from the GPU but every `--logging_steps`), fused Adam and the §5.3 schedule, in as few
   batches a step as the GPU's memory holds (`--max_tokens 0`). After `--warmup` steps (compiling, if compiled),
   `--steps` timed ones: target tokens/s, seconds a step, peak memory, the caching allocator's calls to CUDA a step
   (allocations, frees, retries), the host's seconds a step reading and padding batches (which the GPU does not wait
   for unless they exceed its step), the host's seconds to hand a step to an idle GPU (at the step's seconds, the
   host sets the pace), host waits in a step, one step profiled (the GPU's busy share, kernels launched, the 8
   slowest kernels, the host's calls of most self time), and STEADY_STEPS steps profiled one after another as run.py
   makes them: the GPU's idle share, the part of it between kernels run back to back, and its longest gaps, with
   what launched the kernel after each (their Chrome trace in steady.json.gz);
2. FLOPs: the timed steps' forward and backward again, eager, under `torch.utils.flop_counter.FlopCounterMode` (the
   matrix products and attention's kernels, whose share is also reported), beside 6 x the weights each (padded) token
   passes through, which leaves attention out (on a CPU the count without attention's kernels and the estimate agree);
   MFU = all the counted FLOPs / the timed steps' seconds / the GPU's dense bf16 peak (PEAKS);
3. Marian: MarianMTModel at the same size, by `Seq2SeqTrainer` (bf16, fused AdamW, label smoothing 0.1) on the same
   batches, accumulated as ours, with torch's choice of attention kernels: target tokens/s of its timed steps;
4. projected: the paper's recipes on this GPU at the measured seconds a step (base 100k steps, big 300k).

Writes utilisation.json and utilisation.md to --output_dir.
"""

import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np
import torch
from gpu_check import device_name, kernels_of, output_and_device, release, sync_places, synchronize
from speed import scratch_folder

from training.batching import EpochBatches, collate
from training.distributed import prepare, unwrap
from training.loss import label_smoothed_nll
from training.schedule import paper_optimizer
from training.step import TrainingStep, compile_backend, deterministic_kernels, largest_batch, read_values
from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, fast_gpu
from vaswani_hf.modeling_vaswani import shift_tokens_right
from vaswani_hf.speed.kernels import cpu_name

# Dense bf16 tensor-core peaks, FLOP/s (the sparse figures are twice these: never used), by a part of the GPU's name.
PEAKS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 70e12, "L4": 121e12,
         "V100": 125e12}
SIZES = {
    "base": {"d_model": 512, "d_ff": 2048, "num_heads": 8, "num_layers": 6, "dropout": 0.1, "recipe_steps": 100_000},
    "big": {"d_model": 1024, "d_ff": 4096, "num_heads": 16, "num_layers": 6, "dropout": 0.3, "recipe_steps": 300_000},
    "tiny": {"d_model": 32, "d_ff": 64, "num_heads": 4, "num_layers": 2, "dropout": 0.1, "recipe_steps": 100_000},
}
VOCAB, TOKENS_PER_STEP, MAX_LENGTH, PAD, BOS, EOS = 37000, 25000, 256, 0, 1, 2
STEADY_STEPS = 5  # profiled one after another, as run.py makes them: the GPU's idle time in steady state
BACK_TO_BACK_US = 20  # a gap shorter than this is kernels run one after another, not a wait for the host
TINY = {"vocab": 300, "tokens_per_step": 800, "pairs": 3000, "warmup": 2, "steps": 4}  # --tiny: on a CPU
TARGETS = {"base": {"mfu": 0.20, "over_marian": 2.0}, "big": {"mfu": 0.30, "over_marian": 2.0}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--sizes", nargs="+", choices=["base", "big"], default=["base", "big"])
    parser.add_argument("--tiny", action="store_true", help="tiny sizes, on any device (the tests' way)")
    parser.add_argument("--processes", type=int, default=None, help="fresh processes per size (default: 3 on a GPU, "
                                                                     "1 with --tiny)")
    parser.add_argument("--warmup", type=int, default=None, help="steps before timing (default 10; --tiny 2)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps (default 20; --tiny 4)")
    parser.add_argument("--compile", default="auto", help="as run.py's (auto, no, or a torch.compile backend)")
    parser.add_argument("--cudnn_attention", action="store_true",
                        help="as run.py's: ours may train with cuDNN's attention kernels (torch's choice on Hopper)")
    parser.add_argument("--deterministic", action="store_true", help="as run.py's: deterministic kernels only")
    parser.add_argument("--max_tokens", type=int, default=0, help="as run.py's (0: the most the GPU's memory holds)")
    parser.add_argument("--pad_to_multiple_of", type=int, default=1)
    parser.add_argument("--no_fast_gpu", action="store_true", help="without vaswani_hf.fast_gpu (run.py applies it)")
    parser.add_argument("--logging_steps", type=int, default=10)
    parser.add_argument("--skip_marian", action="store_true")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a size, measured in this process (a child's way)
    args = parser.parse_args(argv)
    for name in ("processes", "warmup", "steps", "max_tokens", "pad_to_multiple_of", "logging_steps"):
        low = 0 if name in ("warmup", "max_tokens") else 1
        if getattr(args, name) is not None and getattr(args, name) < low:
            raise SystemExit(f"error: --{name} {getattr(args, name)}: must be at least {low}")
    if args.compile not in ("auto", "no") and args.compile not in torch._dynamo.list_backends(exclude_tags=()):
        raise SystemExit(f"error: --compile {args.compile}: auto, no, or one of {torch._dynamo.list_backends()}")
    output_dir, device = output_and_device(args.output_dir, args.tiny)
    args.warmup = TINY["warmup"] if args.warmup is None and args.tiny else 10 if args.warmup is None else args.warmup
    args.steps = TINY["steps"] if args.steps is None and args.tiny else args.steps or 20
    output_dir.mkdir(parents=True, exist_ok=True)
    if args.one:
        result = measure(args.one, args)
        (output_dir / "utilisation.json").write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
        return 0

    processes = args.processes or (1 if args.tiny else 3)
    report = {"date": datetime.date.today().isoformat(), "device": device_name(device), "host": cpu_name(),
              "torch": torch.__version__, "flags": {k: v for k, v in vars(args).items() if k not in ("one",)},
              "sizes": {}, "errors": {}}
    for size in (["tiny"] if args.tiny else args.sizes):
        runs = []
        for index in range(processes):
            folder = output_dir / f"{size}-{index + 1}"
            command = [sys.executable, __file__, *(argv if argv is not None else sys.argv[1:]), "--one", size,
                       "--output_dir", str(folder)]
            started = time.perf_counter()
            result = subprocess.run(command, check=False, capture_output=True, encoding="utf-8")
            print(f"utilisation: {size}, process {index + 1}: {time.perf_counter() - started:.0f} s", flush=True)
            if not result.returncode:  # each process's figures as they come: a GPU call can end before the report
                figures = json.loads((folder / "utilisation.json").read_text(encoding="utf-8"))
                print(json.dumps(brief(figures)), flush=True)
            if result.returncode:  # reported, and the next size still runs: a GPU's minutes are few
                report["errors"][f"{size}, process {index + 1}"] = result.stderr[-3000:]
                print(result.stderr[-3000:], file=sys.stderr)
                break
            runs.append(json.loads((folder / "utilisation.json").read_text(encoding="utf-8")))
        if runs:
            report["sizes"][size] = summary(size, runs)
        (output_dir / "utilisation.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (output_dir / "utilisation.md").write_text(markdown(report), encoding="utf-8")
    print((output_dir / "utilisation.md").read_text(encoding="utf-8"))
    return 1 if report["errors"] else 0


def brief(run: dict) -> dict:
    """One process's headline figures."""
    keys = ("seconds_per_step", "target_tokens_per_second", "mfu", "peak_memory_gib", "compiled_graphs",
            "warmup_seconds")
    return {**{key: run[key] for key in keys}, "busy": run["profile"].get("busy"),
            "host_issue_seconds_per_step": run["host_issue_seconds_per_step"],
            "host_ms": {k["call"][:40]: round(k["ms"], 1) for k in run["profile"]["top_host"][:4]},
            "allocator_calls_per_step": run["allocator_calls_per_step"], "host_waits_at": run["host_waits_at"],
            "steady_idle_share": (run["steady"] or {}).get("idle_share"),
            "marian_tokens_per_second": run.get("marian", {}).get("target_tokens_per_second")}


def peak_flops(name: str) -> float | None:
    return next((peak for key, peak in PEAKS.items() if key in name), None)


def wmt_like_pairs(count: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Source and target lengths like WMT14 EN-DE's under a joint BPE of 37,000 (about 27 tokens on average, a
    log-normal tail cut at MAX_LENGTH; targets about 10% longer), with </s> counted."""
    rng = np.random.default_rng(seed)
    source = np.clip(np.round(rng.lognormal(3.1, 0.62, count)), 1, MAX_LENGTH).astype(np.int32)
    target = np.clip(np.round(source * rng.lognormal(0.08, 0.2, count)), 1, MAX_LENGTH).astype(np.int32)
    return source, target


def token_file(folder: Path, source: np.ndarray, target: np.ndarray, vocab: int):
    """The pairs, random ids of these lengths ending in </s>, as training/tokens.py writes a run's tokens."""
    import datasets
    import pyarrow as pa
    from datasets.arrow_writer import ArrowWriter

    from training.tokens import FEATURES

    rng = np.random.default_rng(1)

    def lists(lengths):
        offsets = np.r_[0, np.cumsum(lengths)].astype(np.int32)
        ids = rng.integers(4, vocab, offsets[-1], dtype=np.int32)
        ids[offsets[1:] - 1] = EOS
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids))

    path = folder / "tokens.arrow"
    with ArrowWriter(features=FEATURES, path=str(path)) as writer:
        writer.write_table(pa.table({"source_ids": lists(source), "target_ids": lists(target),
                                     "source_length": pa.array(source), "target_length": pa.array(target)}))
        writer.finalize()
    return datasets.Dataset.from_file(str(path))


def measure(size: str, args) -> dict:
    """One size in this process: ours (run.py's step), its FLOPs, and Marian by Seq2SeqTrainer."""
    from accelerate import Accelerator

    tiny = size == "tiny"
    vocab, tokens_per_step = (TINY["vocab"], TINY["tokens_per_step"]) if tiny else (VOCAB, TOKENS_PER_STEP)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    if args.deterministic:  # before the first product: cuBLAS reads its workspace setting when it starts
        deterministic_kernels()
    accelerator = Accelerator(mixed_precision="bf16", cpu=device.type == "cpu")
    shape = {key: value for key, value in SIZES[size].items() if key != "recipe_steps"}
    config = VaswaniConfig(vocab_size=vocab, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                           decoder_start_token_id=BOS, **shape)
    torch.manual_seed(0)
    model = VaswaniForConditionalGeneration(config)
    if device.type == "cuda" and not args.no_fast_gpu:
        fast_gpu(model)
    if args.max_tokens:
        max_tokens = args.max_tokens
    elif device.type == "cuda":
        max_tokens = largest_batch(accelerator, model, tokens_per_step, MAX_LENGTH, args.cudnn_attention)
    else:
        max_tokens = tokens_per_step // 2  # two batches a step: the accumulation runs too
    accumulation = math.ceil(tokens_per_step / max_tokens)
    model, optimizer, scheduler = prepare(accelerator, model, lambda m: paper_optimizer(m, config.d_model))
    workspace = Path(scratch_folder())
    lengths = wmt_like_pairs(TINY["pairs"] if tiny else 400_000, vocab)
    batches = EpochBatches(token_file(workspace, *lengths, vocab), MAX_LENGTH, max_tokens, 0, accumulation, 0, 1)
    backend = compile_backend(args.compile, device)
    step = TrainingStep(accelerator, model, 0.1, backend, args.cudnn_attention)
    model.train()

    host, inputs_of = [], {}

    def one_step(index: int) -> tuple[torch.Tensor, int]:
        """run.py's step `index`: its batches read and padded (the host's seconds kept), forward, backward, Adam."""
        started = time.perf_counter()
        ids = batches.step(index)
        inputs = [collate(range(len(s)), s, t, PAD, device, args.pad_to_multiple_of) for s, t in ids]
        host.append(time.perf_counter() - started)
        inputs_of[index] = ids
        loss, tokens = step(inputs, sum(len(target) for _, targets in ids for target in targets))
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        return loss, tokens

    def steps(indices: range) -> tuple[int, float]:
        """Target tokens and seconds of these steps, the losses read every --logging_steps, as run.py reads them."""
        started, tokens, unread = time.perf_counter(), 0, []
        for index in indices:
            loss, count = one_step(index)
            tokens += count
            unread.append({"loss": loss})
            if (index + 1) % args.logging_steps == 0:
                read_values(unread)
        read_values(unread)
        synchronize(device)
        return tokens, time.perf_counter() - started

    _, warmup_seconds = steps(range(args.warmup))
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats()
    host.clear()
    timed = range(args.warmup, args.warmup + args.steps)
    before = allocator_calls(device)
    tokens, seconds = steps(timed)
    data_seconds = statistics.median(host)  # the timed steps' alone, not those waited for or profiled below
    allocator = {key: (count - before[key]) / args.steps for key, count in allocator_calls(device).items()}
    peak = torch.cuda.max_memory_allocated() / 2**30 if device.type == "cuda" else None
    waits = sync_places(device, lambda: one_step(timed.stop))
    profile = kernels_of(device, lambda: one_step(timed.stop + 1), seconds / args.steps, top=8)
    issue = issue_seconds(device, one_step, range(timed.stop + 2, timed.stop + 5))
    # A step queued first, so the profile starts in steady state; then steps between two reads at --logging_steps 10.
    first = timed.stop + 10
    steady = steady_profile(device, lambda: one_step(first), lambda: steps(range(first + 1, first + 1 + STEADY_STEPS)),
                            Path(args.output_dir) / "steady.json.gz")

    flops, attention = counted_flops(accelerator, unwrap(model), [inputs_of[index] for index in timed], device,
                                     args.pad_to_multiple_of)
    passed = weights_passed(unwrap(model))
    padded = side_tokens([inputs_of[index] for index in timed], args.pad_to_multiple_of)
    estimate = 6 * sum(passed[side] * count for side, count in padded.items())
    result = {
        "size": size, "parameters": unwrap(model).num_parameters(), "max_tokens": max_tokens,
        "batches_per_step": accumulation, "compile": compiled_by(backend), "compiled_graphs": step.compilations(),
        "cudnn_attention": args.cudnn_attention, "deterministic": args.deterministic,
        "graph_breaks": graph_breaks(), "profile": profile, "steady": steady,
        "warmup_steps": args.warmup, "warmup_seconds": warmup_seconds, "steps": args.steps,
        "seconds_per_step": seconds / args.steps, "target_tokens_per_step": tokens / args.steps,
        "target_tokens_per_second": tokens / seconds, "peak_memory_gib": peak, "allocator_calls_per_step": allocator,
        "host_data_seconds_per_step": data_seconds, "host_issue_seconds_per_step": issue,
        "host_waits_per_step": None if waits is None else len(waits), "host_waits_at": waits,
        "flops_per_step": flops / args.steps, "attention_flops_per_step": attention / args.steps,
        "estimated_flops_per_step": estimate / args.steps,
        "tflops_per_second": flops / seconds / 1e12,
    }
    peak_rate = peak_flops(device_name(device))
    result["mfu"] = flops / seconds / peak_rate if peak_rate else None
    if not args.skip_marian:
        del model, optimizer, step
        release(device)
        result["marian"] = marian(size, config, [inputs_of[index] for index in range(args.warmup + args.steps)],
                                  accumulation, args.warmup, device, workspace, args.pad_to_multiple_of)
    return result


def issue_seconds(device: torch.device, one_step, indices: range) -> float | None:
    """The median seconds the host takes to hand one step to an idle GPU, its batches read and padded, each step
    started on an empty queue and its kernels not waited for: near the step's seconds with no wait in the step, the
    host sets the pace; with a wait, up to the wait's place the GPU's time is in it too. None on a CPU, where the
    host computes the step itself."""
    if device.type != "cuda":
        return None
    seconds = []
    for index in indices:
        synchronize(device)
        started = time.perf_counter()
        one_step(index)
        seconds.append(time.perf_counter() - started)
    synchronize(device)
    return statistics.median(seconds)


def steady_profile(device: torch.device, queued, call, trace: Path, top: int = 6) -> dict | None:
    """`call()`, STEADY_STEPS steps as run.py makes them (nothing waited for between them), profiled on a GPU after
    `queued()` has handed it a step: where the GPU idles in steady state. Its kernels' busy time over the window from
    the first kernel's start to the last one's end (the queued step's tail in it), the idle time in gaps shorter than
    BACK_TO_BACK_US (kernels one after another: fewer kernels, or CUDA graphs, would cut it), and the `top` longest
    gaps: the kernels on either side, the
    host's operator that launched the kernel which ends the gap, and how long after the GPU went idle it was launched
    (above 0: the GPU waited for the host; below: for something else). The profile's Chrome trace is written to
    `trace` (gzipped) for reading in full. None on a CPU, where the steps run unprofiled; a failure of the analysis is
    reported, not raised: the figures measured before it come back from a lent GPU."""
    import gzip
    import shutil

    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiled

    queued()
    if device.type != "cuda":  # the same steps, unprofiled
        call()
        return None
    with profiled(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
        call()
    try:
        plain = trace.with_suffix("")  # steady.json
        profiler.export_chrome_trace(str(plain))
        with plain.open("rb") as source, gzip.open(trace, "wb") as packed:
            shutil.copyfileobj(source, packed)
        plain.unlink()
        return steady_gaps(profiler.events(), top)
    except Exception as error:  # noqa: BLE001 - the figures before it come back; what broke is reported
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def steady_gaps(events, top: int) -> dict:
    """steady_profile's figures from the profiler's events."""
    from torch.autograd import DeviceType

    kernels = [event for event in events if event.device_type == DeviceType.CUDA and not event.is_user_annotation]
    # The CUDA runtime's call that launched a kernel shares its correlation id; its parent is the host's operator.
    launched = {event.id: event for event in events if event.device_type == DeviceType.CPU
                and event.name.startswith(("cudaLaunch", "cuLaunch", "cudaMemcpy", "cudaMemset"))}
    busy, gaps = idle_gaps([(kernel.time_range.start, kernel.time_range.end) for kernel in kernels])
    window = max(k.time_range.end for k in kernels) - min(k.time_range.start for k in kernels)

    def described(gap):
        start, end, before, after = gap
        launch = launched.get(kernels[after].id)
        return {"ms": (end - start) / 1e3, "after": kernels[before].name[:80], "before": kernels[after].name[:80],
                "launched_by": None if launch is None else (launch.cpu_parent or launch).name[:80],
                "launched_ms_after_idle": None if launch is None else (launch.time_range.start - start) / 1e3}

    return {"steps": STEADY_STEPS, "window_ms": window / 1e3, "kernel_ms": busy / 1e3, "idle_share": 1 - busy / window,
            "gaps": len(gaps), "back_to_back_ms": sum(end - start for start, end, _, _ in gaps
                                                      if end - start < BACK_TO_BACK_US) / 1e3,
            "longest": [described(gap) for gap in sorted(gaps, key=lambda gap: gap[0] - gap[1])[:top]]}


def idle_gaps(kernels: list[tuple[float, float]]) -> tuple[float, list[tuple[float, float, int, int]]]:
    """The device's busy time under kernels' (start, end) intervals, which may overlap (several streams), and its
    idle gaps between the first start and the last end: (start, end, the kernel whose end begins the gap, the kernel
    whose start ends it), kernels by their index in `kernels`."""
    order = sorted(range(len(kernels)), key=lambda index: kernels[index])
    start, end = kernels[order[0]]
    last, busy, gaps = order[0], 0.0, []
    for index in order[1:]:
        begins, ends = kernels[index]
        if begins > end:
            busy += end - start
            gaps.append((end, begins, last, index))
            start, end, last = begins, ends, index
        elif ends > end:
            end, last = ends, index
    return busy + end - start, gaps


def compiled_by(backend: str | None) -> str:
    """The backend, and for inductor the language of the code that calls its kernels (C++ with
    TORCHINDUCTOR_CPP_WRAPPER=1, Python by default)."""
    from torch._inductor import config

    if backend == "inductor":
        return f"inductor, {'C++' if config.cpp_wrapper else 'Python'} wrapper"
    return backend or "no"


def allocator_calls(device: torch.device) -> dict[str, int]:
    """How often the caching allocator has called CUDA so far (cudaMalloc or cuMemMap; frees; allocations that failed
    and were retried after freeing its cache): a step that keeps calling after warm-up reuses too little. Empty on
    a CPU."""
    if device.type != "cuda":
        return {}
    stats = torch.cuda.memory_stats(device)
    return {key: stats.get(key, 0) for key in ("num_device_alloc", "num_device_free", "num_alloc_retries")}


def graph_breaks() -> dict[str, int]:
    """Why dynamo broke the compiled graph, and how often (its counters), for the GPU's report."""
    from torch._dynamo.utils import counters

    return {reason[:200]: count for reason, count in counters["graph_break"].most_common(8)}


def counted_flops(accelerator, model, steps: list, device: torch.device, multiple: int) -> tuple[float, float]:
    """FLOPs of these steps' forward and backward passes (the ids of each step's batches), eager, as
    FlopCounterMode counts them, and those of attention's kernels among them (which torch counts on a GPU, and
    from 2.15 on a CPU too); the gradients are dropped after."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        for batches in steps:
            for sources, targets in batches:
                batch = collate(range(len(sources)), sources, targets, PAD, device, multiple)
                with accelerator.autocast():
                    decoder_input_ids = shift_tokens_right(batch["labels"], PAD, BOS)
                    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                                   decoder_input_ids=decoder_input_ids, use_cache=False).logits
                    label_smoothed_nll(logits, batch["labels"])[0].backward()
    model.zero_grad(set_to_none=True)
    attention = sum(count for op, count in counter.get_flop_counts()["Global"].items() if "attention" in str(op))
    return counter.get_total_flops(), attention


def weights_passed(model) -> dict[str, int]:
    """The weights of the matrix products a source token and a target token pass through: the encoder's layers and
    the encoder-decoder attention's keys and values; the rest of the decoder's layers and the output projection."""
    matrices = lambda module: sum(p.numel() for p in module.parameters() if p.dim() == 2)
    cross = sum(matrices(layer.encoder_attn.k_proj) + matrices(layer.encoder_attn.v_proj)
                for layer in model.model.decoder.layers)
    return {"source": matrices(model.model.encoder.layers) + cross,
            "target": matrices(model.model.decoder.layers) - cross + model.lm_head.weight.numel()}


def side_tokens(steps: list, multiple: int) -> dict[str, int]:
    """Source and target tokens of these steps, padded as collate pads them (what the products compute over)."""
    counted = {"source": 0, "target": 0}
    for batches in steps:
        for sources, targets in batches:
            for side, rows in (("source", sources), ("target", targets)):
                counted[side] += len(rows) * -(-max(map(len, rows)) // multiple) * multiple
    return counted


def marian(size: str, config: VaswaniConfig, steps: list, accumulation: int, warmup: int, device: torch.device,
           workspace: Path, multiple: int) -> dict:
    """MarianMTModel of the same size trained by Seq2SeqTrainer on the same batches (one batch a trainer
    micro-batch, `accumulation` of them a step): target tokens/s of the steps after `warmup`."""
    from speed import build
    from transformers import Seq2SeqTrainer, Seq2SeqTrainingArguments, TrainerCallback

    shape = {"d_model": config.d_model, "num_layers": config.num_layers, "num_heads": config.num_heads,
             "d_ff": config.d_ff, "vocab_size": config.vocab_size}
    model = build("marian", shape).to(device)
    batches = [collate(range(len(s)), s, t, PAD, "cpu", multiple) for step in steps for s, t in step]
    for batch in batches:  # as DataCollatorForSeq2Seq(model=...) adds them, which the Trainer's label smoothing needs
        batch["decoder_input_ids"] = model.prepare_decoder_input_ids_from_labels(labels=batch["labels"])
    tokens = [sum(len(target) for _, targets in step for target in targets) for step in steps]
    times = []

    class Clock(TrainerCallback):
        def on_step_end(self, *unused, **unused_too):
            synchronize(device)
            times.append(time.perf_counter())

    gpu = device.type == "cuda"
    arguments = Seq2SeqTrainingArguments(
        output_dir=str(workspace / "marian"), max_steps=len(steps), per_device_train_batch_size=1,
        gradient_accumulation_steps=accumulation, learning_rate=7e-4, lr_scheduler_type="inverse_sqrt",
        warmup_steps=4000, adam_beta2=0.98, adam_epsilon=1e-9, weight_decay=0.0, max_grad_norm=0.0,
        label_smoothing_factor=0.1, bf16=True, optim="adamw_torch_fused" if gpu else "adamw_torch",
        logging_steps=10, save_strategy="no", report_to=[], disable_tqdm=True, dataloader_pin_memory=gpu,
        remove_unused_columns=False, use_cpu=not gpu, train_sampling_strategy="sequential")
    trainer = Seq2SeqTrainer(model=model, args=arguments, train_dataset=batches,
                             data_collator=lambda features: features[0], callbacks=[Clock()])
    trainer.train()
    seconds = times[-1] - times[warmup - 1] if warmup else times[-1] - times[0]
    counted = tokens[warmup:] if warmup else tokens[1:]
    return {"target_tokens_per_second": sum(counted) / seconds, "seconds_per_step": seconds / len(counted)}


def summary(size: str, runs: list[dict]) -> dict:
    """Each figure's median over the processes; ours / Marian the median of the processes' ratios; the projected
    hours of the paper's recipe."""
    keys = [key for key, value in runs[0].items() if isinstance(value, int | float) and key != "size"]
    medians = {key: statistics.median(run[key] for run in runs) for key in keys if runs[0][key] is not None}
    found = {**runs[0], **medians, "processes": runs}
    if "marian" in runs[0]:
        found["over_marian"] = statistics.median(
            run["target_tokens_per_second"] / run["marian"]["target_tokens_per_second"] for run in runs)
        found["marian"] = {"target_tokens_per_second": statistics.median(
            run["marian"]["target_tokens_per_second"] for run in runs)}
    found["recipe_steps"] = SIZES[size]["recipe_steps"]
    found["recipe_hours"] = SIZES[size]["recipe_steps"] * found["seconds_per_step"] / 3600
    targets = TARGETS.get(size, {})
    found["targets"] = {
        "mfu": {"target": targets.get("mfu"), "met": None if found.get("mfu") is None or "mfu" not in targets
                else found["mfu"] >= targets["mfu"]},
        "over_marian": {"target": targets.get("over_marian"),
                        "met": None if "over_marian" not in found or "over_marian" not in targets
                        else found["over_marian"] >= targets["over_marian"]}}
    return found


def gap_text(gap: dict) -> str:
    """One of steady_profile's gaps in words."""
    lag = "?" if gap["launched_ms_after_idle"] is None else f"{gap['launched_ms_after_idle']:+.2f} ms"
    return (f"{gap['ms']:.2f} ms after {gap['after'][:50]}, before {gap['before'][:50]} (launched by "
            f"{(gap['launched_by'] or '?')[:50]} {lag} from the idle's start)")


def markdown(report: dict) -> str:
    header = ("| size | batches a step | target tokens/s | ours / Marian | TFLOP/s | MFU | peak GiB | s a step | "
              "recipe hours | graphs | host s a step: data, issue; waits |")
    lines = [f"**{report['device']}**, {report['date']}; host {report['host']}; torch {report['torch']}", "", header,
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for size, s in report["sizes"].items():
        ratio = f"{s['over_marian']:.2f}x" if "over_marian" in s else "–"
        mfu = f"{s['mfu']:.1%}" if s.get("mfu") is not None else "–"
        peak = f"{s['peak_memory_gib']:.1f}" if s.get("peak_memory_gib") is not None else "–"
        issue = f"{s['host_issue_seconds_per_step']:.3f}" if s.get("host_issue_seconds_per_step") is not None else "–"
        cells = [size, f"{s['batches_per_step']} of <= {s['max_tokens']}", f"{s['target_tokens_per_second']:,.0f}",
                 ratio, f"{s['tflops_per_second']:.1f}", mfu, peak, f"{s['seconds_per_step']:.3f}",
                 f"{s['recipe_hours']:.1f} ({s['recipe_steps'] // 1000}k steps)", str(s["compiled_graphs"]),
                 f"{s['host_data_seconds_per_step']:.3f}, {issue}; {s['host_waits_per_step']}"]
        lines.append("| " + " | ".join(cells) + " |")
    for size, s in report["sizes"].items():
        by = ", ".join(f"{run['target_tokens_per_second']:,.0f}" for run in s["processes"])
        lines.append(f"\n{size}: {len(s['processes'])} process(es), each figure the median; target tokens/s by "
                     f"process {by}; FlopCounterMode {s['flops_per_step'] / 1e12:.2f} TFLOP a step (attention's "
                     f"kernels {s['attention_flops_per_step'] / 1e12:.2f}), 6 x weights passed "
                     f"{s['estimated_flops_per_step'] / 1e12:.2f}; compile {s['compile']}, cuDNN attention "
                     f"{'yes' if s['cudnn_attention'] else 'no'}, deterministic "
                     f"{'yes' if s['deterministic'] else 'no'}, warm-up "
                     f"{s['warmup_steps']} steps in {s['warmup_seconds']:.0f} s; targets: " + ", ".join(
                         f"{name} >= {t['target']} {'met' if t['met'] else 'missed' if t['met'] is False else '–'}"
                         for name, t in s["targets"].items() if t["target"] is not None))
        if "busy" in s["profile"]:  # on a GPU
            p = s["profile"]
            lines.append(f"{size}, one step profiled (process 1): GPU busy {p['busy']:.0%} of {p['wall_ms']:.0f} ms, "
                         f"{p['launches']} kernels launched; slowest: " + "; ".join(
                             f"{k['kernel'][:60]} {k['ms']:.1f} ms ({k['calls']})" for k in p["top_kernels"][:5]))
        if s["allocator_calls_per_step"]:  # on a GPU
            lines.append(f"{size}, the caching allocator's calls to CUDA a timed step (process 1): " + ", ".join(
                f"{key} {count:.1f}" for key, count in s["allocator_calls_per_step"].items()))
        lines.append(f"{size}, the host's calls of most self time in that step: " + "; ".join(
            f"{k['call'][:60]} {k['ms']:.1f} ms ({k['calls']})" for k in s["profile"]["top_host"]))
        if (s.get("steady") or {}).get("error"):
            lines.append(f"{size}, steps profiled as run.py makes them: failed: {s['steady']['error']}")
        elif s.get("steady"):  # on a GPU
            t = s["steady"]
            lines.append(f"{size}, {t['steps']} steps profiled as run.py makes them (process 1): kernels "
                         f"{t['kernel_ms']:.1f} ms of a {t['window_ms']:.1f}-ms window, the GPU idle "
                         f"{t['idle_share']:.1%}, {t['back_to_back_ms']:.1f} ms of it in gaps under "
                         f"{BACK_TO_BACK_US} µs (of {t['gaps']}); the longest: "
                         + "; ".join(map(gap_text, t["longest"])))
        if s.get("host_waits_at"):  # on a GPU, where a step waited
            lines.append(f"{size}, where the host waited for the GPU in a step (process 1): " + "; ".join(
                s["host_waits_at"]))
        if s["graph_breaks"]:
            lines.append(f"{size}: graph breaks: {s['graph_breaks']}")
    lines += [f"\n{name} FAILED: {error.strip().splitlines()[-1] if error.strip() else '?'}"
              for name, error in report["errors"].items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
