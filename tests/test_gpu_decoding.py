"""benchmarks/gpu_decoding.py, the GPU decoding benchmark, run at tiny sizes on the CPU: every engine it times decodes
the same batches to the same length (each asserts its output's length), before a GPU is at hand."""

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_decoding
from gpu_decoding import main, mapped_files


def test_every_engine_decodes_the_sources_at_tiny_sizes_on_a_cpu(tmp_path, capsys):
    main(["--tiny", "--sentences", "12", "--output_dir", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "decoding.json").read_text())
    assert report["errors"] == {}
    assert set(report["engines"]) == {
        "ours (GNMT search, vaswani-translate's)", "transformers beam search",
        "transformers beam search, static cache (compiled on a GPU)", "CTranslate2 export, float32",
        "CTranslate2 export, int8"}
    assert all(engine["sentences_per_second"] == pytest.approx(12 / engine["seconds"])
               for engine in report["engines"].values())
    ours, peer = (report["engines"][name]["sentences_per_second"]
                  for name in ("ours (GNMT search, vaswani-translate's)", "CTranslate2 export, int8"))
    assert report["sentences"] == 12 and f"| CTranslate2 export, int8 | {peer:.1f} | {peer / ours:.2f}x |" in (
        capsys.readouterr().out)
    if torch.version.cuda is None:  # torch's CPU build and CTranslate2 on a CPU load no cuBLAS; a CUDA build does
        assert report["cublas"] == []
    assert all(Path(file).name.startswith("libcublas") for file in report["cublas"])


def test_the_rate_leaves_the_warm_up_batch_out_and_times_every_batch_once(monkeypatch):
    """`timed` on a clock that only the engine moves: the first batch decoded once to warm up (100 s: a compilation),
    then every batch once at 1 s a sentence; sentences/s counts the second pass alone, the warm-up reported apart."""
    clock, decoded = [0.0], []

    def engine(batch):
        clock[0] += 100.0 if not decoded else len(batch)
        decoded.append(batch)

    monkeypatch.setattr(gpu_decoding.time, "perf_counter", lambda: clock[0])
    batches = [[[5, 2]] * 3, [[6, 2]] * 2, [[7, 2]] * 5]
    found = gpu_decoding.timed(engine, batches, torch.device("cpu"))
    assert decoded == [batches[0], *batches]
    assert found == {"sentences_per_second": 1.0, "seconds": 10.0, "first_batch_seconds": 100.0}


def test_the_report_names_the_library_files_the_process_has_loaded():
    """What names the cuBLAS that CTranslate2 ran on (on the GPU machine, CUDA 13's under CUDA 12's name)."""
    torch_files = mapped_files("libtorch_cpu")
    assert torch_files and all(Path(f).name.startswith("libtorch_cpu") and Path(f).is_file() for f in torch_files)
    assert mapped_files("libnot-a-library") == []


def test_too_few_sentences_is_a_one_line_error_before_any_work(tmp_path):
    with pytest.raises(SystemExit, match="^error: --sentences 0: must be at least 1$"):
        main(["--tiny", "--sentences", "0", "--output_dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
