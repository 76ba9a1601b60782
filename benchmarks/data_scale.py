"""The training data pipeline at the paper's sizes (WMT14 EN-DE: 4.5M pairs, EN-FR: 36M), by simulation.

    python benchmarks/data_scale.py                                   # 0.1M, 1M and 5M pairs; 1 and 2 processes
    python benchmarks/data_scale.py --sizes 100000 1000000 --processes 1 --work_dir /tmp/scale

Writes synthetic aligned corpora (two made-up languages of a million words built from syllables, drawn by Zipf's law
with exponent 1.2, so that about 9% of running words lie beyond the 10,000 most frequent, as in news text; sentence
lengths log-normal like WMT's, median 20 words), then for each size and number of processes runs `training/run.py` as a
user would (`accelerate launch`, a 3+3-layer model of d_model 256 given as flags, `--bpe_sample 100000`,
`--no_fast_cpu`: fast_cpu's one-time timing of the CPU would fall in the first launch alone) twice: cold (a new output
folder and an empty datasets cache) and warm (the same run resumed from its checkpoint). For each it reports the peak
resident memory (and the private part of it) of every training process and of the tokenizing workers, the seconds from
the launch until the run's first checkpoint is written (its first optimizer step done, then a checkpoint of a few MB),
and the token cache's size on disk; beside them, the run's tokenization speed against `tokenizer(texts)` (what every
process did before the cache) on 100,000 pairs of the same corpus with the same tokenizer. The slopes from the two
largest sizes project to 4.5M and 36M pairs. Writes `data_scale.json` and `data_scale.md` in --work_dir.
"""

import argparse
import contextlib
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from vaswani_hf.speed.kernels import cpu_name, usable_cores

MODEL = ["--vocab_size", "4000", "--d_model", "256", "--d_ff", "1024", "--num_heads", "4", "--num_layers", "3",
         "--max_tokens", "2048", "--tokens_per_step", "2048", "--bpe_sample", "100000"]
LANGUAGES = ("en", "de")
OLD_WAY_PAIRS = 100_000  # the first pairs of a corpus that `tokenizer(texts)` is timed on
PAPER_SIZES = {"WMT14 EN-DE": 4_500_000, "WMT14 EN-FR": 36_000_000}


def vocabulary(rng: np.random.Generator, size: int, vowels: str) -> np.ndarray:
    """`size` made-up words of one to five syllables, the frequent ones short (as in real text), some capitalized."""
    onsets = ["", "b", "d", "f", "g", "h", "k", "l", "m", "n", "p", "r", "s", "t", "v", "w", "z", "st", "tr", "br",
              "sch", "ch", "kl", "sp"]
    codas = ["", "", "n", "r", "s", "t", "l", "ng", "ck", "nd"]
    syllables = np.array([o + v + c for o in onsets for v in vowels for c in codas], dtype=object)
    weights = 1 / np.arange(1, len(syllables) + 1) ** 0.8
    rng.shuffle(syllables)
    counts = np.clip(1 + np.log10(np.arange(size) + 1) / 1.6 + rng.normal(0, 0.7, size), 1, 5).astype(int)
    drawn = rng.choice(syllables, size=counts.sum(), p=weights / weights.sum())
    ends = np.cumsum(counts)
    words = ["".join(drawn[a:b]) for a, b in zip(ends - counts, ends)]
    return np.array([w.capitalize() if i % 7 == 3 else w for i, w in enumerate(words)], dtype=object)


def write_corpus(prefix: Path, pairs: int, seed: int = 0, chunk: int = 100_000) -> None:
    """Aligned PREFIX.en / PREFIX.de of `pairs` lines; the same seed gives the same first lines at any size."""
    if all(prefix.with_suffix(f".{lang}").is_file() for lang in LANGUAGES):
        return
    rng = np.random.default_rng(seed)
    words = {lang: vocabulary(rng, 1_000_000, vowels) for lang, vowels in zip(LANGUAGES, ("aeiouy", "aeiouäöü"))}
    zipf = np.cumsum(1 / np.arange(1, 1_000_001) ** 1.2)  # about 9% of words beyond the 10,000 most frequent
    zipf /= zipf[-1]
    with contextlib.ExitStack() as stack:
        files = {lang: stack.enter_context(open(prefix.with_suffix(f".{lang}.partial"), "w", encoding="utf-8"))
                 for lang in LANGUAGES}
        for start in range(0, pairs, chunk):  # whole chunks drawn, the lines wanted written: the same at any size
            source_lengths = np.clip(np.round(rng.lognormal(np.log(20), 0.6, chunk)), 1, 120).astype(int)
            lengths = {"en": source_lengths,
                       "de": np.clip(np.round(source_lengths * rng.lognormal(0, 0.15, chunk)), 1, 140).astype(int)}
            for lang in LANGUAGES:
                drawn = words[lang][np.searchsorted(zipf, rng.random(lengths[lang].sum()))]
                ends = np.cumsum(lengths[lang])
                lines = (" ".join(drawn[a:b]) + " .\n" for a, b in zip(ends - lengths[lang], ends))
                files[lang].writelines(itertools.islice(lines, pairs - start))
    for lang in LANGUAGES:
        os.replace(prefix.with_suffix(f".{lang}.partial"), prefix.with_suffix(f".{lang}"))


def head(source: Path, prefix: Path, pairs: int) -> None:
    for lang in LANGUAGES:
        if not prefix.with_suffix(f".{lang}").is_file():
            with open(source.with_suffix(f".{lang}"), encoding="utf-8") as lines, \
                    open(prefix.with_suffix(f".{lang}"), "w", encoding="utf-8") as out:
                out.writelines(line for _, line in zip(range(pairs), lines))


def processes(root: int) -> dict[int, tuple[int, int, int, bytes]]:
    """{pid: (parent pid, peak resident bytes, private resident bytes now, command line)} of `root`'s descendants that
    can be read (found through /proc/PID/task/TID/children: reading every process's status ten times a second took a
    quarter of a core from the processes measured)."""
    found, parents = {}, [root]
    while parents:
        parent = parents.pop()
        try:
            children = [int(pid) for task in os.scandir(f"/proc/{parent}/task")
                        for pid in Path(task.path, "children").read_text(encoding="utf-8").split()]
        except OSError:
            continue
        for pid in children:
            try:
                status = Path(f"/proc/{pid}/status").read_text(encoding="utf-8")
                command = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
            if "VmHWM" in fields:
                found[pid] = (parent, int(fields["VmHWM"].split()[0]) * 1024, int(fields["RssAnon"].split()[0]) * 1024,
                              command)
                parents.append(pid)
    return found


def watch(launcher: subprocess.Popen, checkpoint: Path) -> tuple[dict[int, tuple[str, int, int]], float | None]:
    """Ten times a second until `launcher` ends: {pid: (role, peak resident bytes, most private bytes)} of the training
    processes ("rank": the launcher's children) and their tokenizing workers ("worker": a rank's forks, which keep its
    command line; not a program a rank starts, such as the resource tracker that Python 3.14's multiprocessing starts
    for tqdm's lock), and the seconds until `checkpoint` appears (None if it does not)."""
    start, peaks, seconds, programs = time.time(), {}, None, set()
    while launcher.poll() is None:
        table = processes(launcher.pid)
        ranks = {pid for pid, (parent, *_) in table.items() if parent == launcher.pid}
        for pid, (parent, peak, private, command) in table.items():
            if parent in ranks and command != table[parent][3]:
                programs.add(pid)  # seen before its exec, it was a fork a moment
            if pid in ranks or parent in ranks:
                _, _, most = peaks.get(pid, (None, 0, 0))
                peaks[pid] = ("rank" if pid in ranks else "worker", peak, max(private, most))
        if seconds is None and checkpoint.is_dir():
            seconds = time.time() - start
        time.sleep(0.1)
    return {pid: figures for pid, figures in peaks.items() if pid not in programs}, seconds


def launch(run_args: list[str], world: int, output_dir: Path, env: dict, checkpoint: int) -> dict:
    """One launch, killed by the run itself one step after checkpoint `checkpoint` (VASWANI_FAULT): the seconds
    until that checkpoint appears, and the peak memory of the training processes and their tokenizing workers
    (`watch`): resident (the kernel's VmHWM, which counts the pages of memory-mapped files the process touched: page
    cache, shared and dropped under memory pressure) and private (RssAnon, polled)."""
    command = [sys.executable, "-m", "accelerate.commands.launch", "--num_processes", str(world), "--num_machines",
               "1", "--mixed_precision", "no", "--dynamo_backend", "no", *(["--multi_gpu"] if world > 1 else []),
               "training/run.py", *run_args]  # --multi_gpu: on a machine without GPUs, CPU processes over gloo
    log = output_dir.with_suffix(f".{checkpoint}.log")
    with open(log, "w", encoding="utf-8") as file:
        launcher = subprocess.Popen(command, cwd=ROOT, stdout=file, stderr=subprocess.STDOUT,
                                    env={**env, "VASWANI_FAULT": f"step-{checkpoint + 1}"})
        peaks, seconds = watch(launcher, output_dir / f"checkpoint-{checkpoint}")
    text = log.read_text(encoding="utf-8")
    if seconds is None:
        raise SystemExit(f"no checkpoint-{checkpoint} in {output_dir}: see {log}\n{text[-2000:]}")
    tokenized = re.search(r"([\d,]+) training pairs tokenized into .* in ([\d.]+) s", text)
    ranks = sorted((p, private) for role, p, private in peaks.values() if role == "rank")
    return {"seconds_to_first_step": round(seconds, 1),
            "rank_peak_mb": [round(p / 2**20) for p, _ in ranks],
            "rank_private_mb": [round(private / 2**20) for _, private in ranks],
            "worker_peak_mb": max([round(p / 2**20) for role, p, _ in peaks.values() if role == "worker"],
                                  default=None),
            "tokenized_pairs_per_second": round(int(tokenized[1].replace(",", "")) / float(tokenized[2]))
            if tokenized else None}


def old_tokenization(prefix: Path, tokenizer_dir: Path) -> float:
    """Pairs per second of `tokenizer(texts)["input_ids"]` on both sides, as every process ran before the cache."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    sides = []
    for lang in LANGUAGES:
        with open(prefix.with_suffix(f".{lang}"), encoding="utf-8") as lines:
            sides.append([line.rstrip("\n") for _, line in zip(range(OLD_WAY_PAIRS), lines)])
    start = time.time()
    for texts in sides:
        tokenizer(texts)["input_ids"]
    return len(sides[0]) / (time.time() - start)


def measure(prefix: Path, pairs: int, world: int, work: Path) -> dict:
    output_dir = work / f"run-{pairs}-{world}"
    cache = work / f"datasets-cache-{pairs}-{world}"
    shutil.rmtree(output_dir, ignore_errors=True)
    shutil.rmtree(cache, ignore_errors=True)
    env = {**os.environ, "HF_DATASETS_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    flags = ["--train_file", str(prefix), "--output_dir", str(output_dir), *MODEL, "--save_steps", "1",
             "--no_fast_cpu"]
    cold = launch([*flags, "--max_steps", "2"], world, output_dir, env, 1)
    warm = launch([*flags, "--max_steps", "3", "--resume_from_checkpoint", "latest"], world, output_dir, env, 2)
    tokens = output_dir / "tokens"
    row = {"pairs": pairs, "processes": world, "cold": cold, "warm": warm,
           "cache_mb": round(sum(f.stat().st_size for f in tokens.iterdir()) / 2**20),
           "text_cache_mb": round(sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 2**20)}
    if world == 1:
        row["old_pairs_per_second"] = round(old_tokenization(prefix, output_dir))
    shutil.rmtree(cache, ignore_errors=True)
    return row


def project(rows: list[dict], target: int) -> dict:
    """Linear in pairs through the two largest sizes, per process count."""
    projected = {}
    for world in sorted({row["processes"] for row in rows}):
        small, large = sorted((r for r in rows if r["processes"] == world), key=lambda r: r["pairs"])[-2:]

        def line(value, small=small, large=large):
            slope = (value(large) - value(small)) / (large["pairs"] - small["pairs"])
            return value(large) + slope * (target - large["pairs"])

        projected[world] = {
            "rank_peak_mb": round(line(lambda r: max(r["cold"]["rank_peak_mb"]))),
            "rank_private_mb": round(line(lambda r: max(r["cold"]["rank_private_mb"]))),
            "cold_seconds": round(line(lambda r: r["cold"]["seconds_to_first_step"])),
            "warm_seconds": round(line(lambda r: r["warm"]["seconds_to_first_step"]), 1),
            "cache_gb": round(line(lambda r: r["cache_mb"] + r["text_cache_mb"]) / 1024, 1)}
    return projected


def table(rows: list[dict], projections: dict) -> str:
    def cold_warm(row, key):  # each training process's figure
        return " / ".join(", ".join(str(value) for value in row[launch][key]) for launch in ("cold", "warm"))

    lines = [("| pairs | processes | peak memory per process, cold / warm (MB) | of it private, cold / warm (MB) | "
              "tokenizing workers (MB) | first step, cold / warm (s) | tokenization, pairs/s (tokenizer(texts)) | "
              "token cache + text cache (MB) |"), "|---:|---:|---|---|---:|---|---|---|"]
    for r in rows:
        old = f" ({r['old_pairs_per_second']:,})" if "old_pairs_per_second" in r else ""
        lines.append(f"| {r['pairs']:,} | {r['processes']} | {cold_warm(r, 'rank_peak_mb')} | "
                     f"{cold_warm(r, 'rank_private_mb')} | {r['cold']['worker_peak_mb'] or '-'} | "
                     f"{r['cold']['seconds_to_first_step']} / {r['warm']['seconds_to_first_step']} | "
                     f"{r['cold']['tokenized_pairs_per_second']:,}{old} | {r['cache_mb']} + {r['text_cache_mb']} |")
    for name, size in projections.items():
        for world, p in size.items():
            lines.append(f"| {name}, projected | {world} | {p['rank_peak_mb']} | {p['rank_private_mb']} | | "
                         f"{p['cold_seconds']} / "
                         f"{p['warm_seconds']} | | {p['cache_gb']} GB |")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000, 5_000_000])
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--work_dir", type=Path, default=Path("/tmp/vaswani-data-scale"))
    args = parser.parse_args()
    args.work_dir.mkdir(parents=True, exist_ok=True)
    largest = args.work_dir / f"corpus-{max(args.sizes)}"
    start = time.time()
    write_corpus(largest, max(args.sizes))
    print(f"corpus of {max(args.sizes):,} pairs in {time.time() - start:.0f} s: {largest}.{{en,de}}", flush=True)
    rows = []
    for pairs in sorted(args.sizes):
        prefix = args.work_dir / f"corpus-{pairs}"
        head(largest, prefix, pairs)
        for world in args.processes:
            rows.append(measure(prefix, pairs, world, args.work_dir))
            print(json.dumps(rows[-1]), flush=True)
    projections = {name: project(rows, size) for name, size in PAPER_SIZES.items()} if len(args.sizes) > 1 else {}
    report = {"cpu": cpu_name(), "cores": usable_cores(), "rows": rows, "projections": projections}
    (args.work_dir / "data_scale.json").write_text(json.dumps(report, indent=1), encoding="utf-8")
    markdown = f"{cpu_name()}, {usable_cores()} cores\n\n{table(rows, projections)}\n"
    (args.work_dir / "data_scale.md").write_text(markdown, encoding="utf-8")
    print(markdown)


if __name__ == "__main__":
    main()
