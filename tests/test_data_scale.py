"""benchmarks/data_scale.py, the README's figures for training data at WMT sizes: its synthetic corpus against the
statistics it claims (Zipf's law, WMT-like lengths), the process tree it reads memory from, its projection, and one
real launch of training/run.py (tiny) read back cold and resumed."""

import os
import subprocess
import sys
import textwrap
from collections import Counter

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import data_scale

from vaswani_hf.speed.kernels import usable_cores

PAIRS = 20_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    prefix = tmp_path_factory.mktemp("corpus") / "corpus"
    data_scale.write_corpus(prefix, PAIRS)
    return {lang: prefix.with_suffix(f".{lang}").read_text(encoding="utf-8").splitlines()
            for lang in data_scale.LANGUAGES}


def test_about_9_percent_of_running_words_lie_beyond_the_10000_most_frequent(corpus):
    ranks = 1 / np.arange(1, 1_000_001) ** 1.2  # Zipf's law with exponent 1.2 over a million words
    expected = ranks[10_000:].sum() / ranks.sum()
    frequent = set(data_scale.vocabulary(np.random.default_rng(0), 1_000_000, "aeiouy")[:10_000])  # as drawn first
    words = [word for line in corpus["en"] for word in line.split()[:-1]]
    beyond = sum(word not in frequent for word in words) / len(words)
    assert expected == pytest.approx(0.09, abs=0.005)
    assert beyond == pytest.approx(expected, abs=0.005), (beyond, expected, len(words))


def test_sentences_are_about_20_words_long_and_their_translations_as_long(corpus):
    lengths = {lang: np.array([len(line.split()) - 1 for line in lines]) for lang, lines in corpus.items()}
    assert all(line.endswith(" .") for lines in corpus.values() for line in lines)
    assert len(lengths["en"]) == len(lengths["de"]) == PAIRS
    assert np.median(lengths["en"]) == 20 and lengths["en"].min() >= 1 and lengths["en"].max() == 120  # a long tail
    assert lengths["en"].mean() == pytest.approx(20 * np.exp(0.6 ** 2 / 2), rel=0.02)  # log-normal, sigma 0.6
    ratio = np.log(lengths["de"] / lengths["en"])
    assert np.median(ratio) == pytest.approx(0, abs=0.01) and np.std(ratio) == pytest.approx(0.15, abs=0.03)
    assert Counter(lengths["de"] == lengths["en"])[False] > PAIRS / 2  # each side drawn its own length


def test_the_same_seed_gives_the_same_first_lines_at_any_size(tmp_path, corpus):
    data_scale.write_corpus(tmp_path / "small", 300)
    for lang in data_scale.LANGUAGES:
        small = (tmp_path / f"small.{lang}").read_text(encoding="utf-8").splitlines()
        assert small == corpus[lang][:300]
    assert not list(tmp_path.glob("*.partial"))


def test_the_process_tree_names_each_process_parent_and_its_private_memory():
    grandchild = textwrap.dedent("""
        import sys
        held = bytearray(64 * 2**20)  # touched: private resident memory
        print("ready", flush=True)
        sys.stdin.read()
    """)
    child = textwrap.dedent(f"""
        import subprocess, sys
        grandchild = subprocess.Popen([sys.executable, "-c", {grandchild!r}], stdin=sys.stdin)
        grandchild.wait()
    """)
    started = subprocess.Popen([sys.executable, "-c", child], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert started.stdout.readline() == "ready\n"
        table = data_scale.processes(os.getpid())
    finally:
        started.communicate("")
    assert table[started.pid][0] == os.getpid()
    (grandchild_pid,) = [pid for pid, (parent, *_) in table.items() if parent == started.pid]
    _, peak, private, command = table[grandchild_pid]
    assert command.split(b"\0")[:2] == [sys.executable.encode(), b"-c"]
    assert 64 * 2**20 <= private <= peak
    assert table[started.pid][2] < 64 * 2**20  # the child holds none of it


def test_a_training_processs_workers_are_its_forks_not_the_programs_it_starts(tmp_path):
    """What the benchmark counts as tokenizing workers: a training process's forks (datasets' pool), not a program it
    starts (Python 3.14's multiprocessing starts its resource tracker for tqdm's lock in every run: it was counted as
    a worker of 14 MB in a resumed run, which tokenizes nothing)."""
    rank = textwrap.dedent("""
        import os, subprocess, sys, time
        program = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1)"])
        worker = os.fork()
        if worker == 0:
            held = bytearray(64 * 2**20)
            time.sleep(1)
            os._exit(0)
        print(os.getpid(), worker, flush=True)
        os.waitpid(worker, 0)
        program.wait()
    """)
    launcher = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {rank!r}])"  # as accelerate launch
    launcher = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True)
    peaks, seconds = data_scale.watch(launcher, tmp_path / "checkpoint-1")
    rank_pid, worker = map(int, launcher.stdout.read().split())
    assert {pid: role for pid, (role, _, _) in peaks.items()} == {rank_pid: "rank", worker: "worker"}  # no program
    assert peaks[worker][1] >= peaks[worker][2] >= 64 * 2**20 > peaks[rank_pid][2]
    assert seconds is None  # no checkpoint appeared


def test_the_projection_is_the_line_through_the_two_largest_sizes_per_process_count():
    def row(pairs, world, base):
        memory, seconds = base + pairs / 1000, base + pairs / 10_000
        cold = {"rank_peak_mb": [memory, memory / 2], "rank_private_mb": [memory / 2],
                "seconds_to_first_step": seconds}
        return {"pairs": pairs, "processes": world, "cold": cold, "warm": {"seconds_to_first_step": seconds / 10},
                "cache_mb": pairs / 1000, "text_cache_mb": pairs / 2000}

    # The smallest size lies off the line: only the two largest count, in whatever order the rows come.
    rows = [row(1_000_000, 1, 100), row(100_000, 1, 5_000), row(5_000_000, 1, 100), row(1_000_000, 2, 300),
            row(5_000_000, 2, 300)]
    projected = data_scale.project(rows, 36_000_000)
    assert projected[1] == {"rank_peak_mb": 36_100, "rank_private_mb": 18_050, "cold_seconds": 3_700,
                            "warm_seconds": 370.0, "cache_gb": round(54_000 / 1024, 1)}
    assert projected[2]["rank_peak_mb"] == 36_300 and projected[2]["cold_seconds"] == 3_900


@pytest.mark.long(minutes=0.5)
def test_a_real_launch_is_read_back_cold_then_resumed_from_its_token_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(data_scale, "MODEL", ["--vocab_size", "300", "--d_model", "16", "--d_ff", "32", "--num_heads",
                                              "2", "--num_layers", "1", "--max_tokens", "256", "--tokens_per_step",
                                              "256", "--bpe_sample", "1000"])
    monkeypatch.setattr(data_scale, "OLD_WAY_PAIRS", 2_000)  # its rate, not 100,000 pairs' (9 s)
    prefix = tmp_path / "corpus"
    data_scale.write_corpus(prefix, 100_000)  # as many as run.py tokenizes in worker processes, one a core it may use
    pinned = os.sched_getaffinity(0)  # one core (conftest.py); the launch on the cores the suite was given
    os.sched_setaffinity(0, os.sched_getaffinity(os.getppid()))  # the controller's (under -n0, the shell's)
    try:
        row, parallel = data_scale.measure(prefix, 100_000, 1, tmp_path), usable_cores() > 1
    finally:
        os.sched_setaffinity(0, pinned)
    cold, warm = row["cold"], row["warm"]
    assert cold["tokenized_pairs_per_second"] > 0 and warm["tokenized_pairs_per_second"] is None  # the cache reused
    for launch in (cold, warm):
        assert 0 < launch["seconds_to_first_step"] < 300
        assert len(launch["rank_peak_mb"]) == len(launch["rank_private_mb"]) == 1  # one training process, torch in it
        assert 100 < launch["rank_private_mb"][0] <= launch["rank_peak_mb"][0]
    assert (cold["worker_peak_mb"] or 0) > 0 if parallel else cold["worker_peak_mb"] is None
    assert warm["worker_peak_mb"] is None  # the tokenizing workers, counted apart; none on one core, none resumed
    run = tmp_path / "run-100000-1"
    assert sorted(path.name for path in run.glob("checkpoint-*")) == ["checkpoint-1", "checkpoint-2"]
    assert row["old_pairs_per_second"] > 0
    assert not (tmp_path / "datasets-cache-100000-1").exists()
    log = (tmp_path / "run-100000-1.1.log").read_text(encoding="utf-8")
    assert "fast_cpu: timing" not in log  # nothing done once per machine
