"""benchmarks/gpu_decoding.py, the GPU decoding benchmark, run at tiny sizes on the CPU: every engine it times decodes
the same batches to the same length (each asserts its output's length), before a GPU is at hand."""

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import gpu_decoding
from gpu_decoding import main, mapped_files
from speed import EOS, PAD

from vaswani_hf import VaswaniForConditionalGeneration


def test_every_engine_decodes_the_sources_at_tiny_sizes_on_a_cpu(tmp_path, capsys):
    main(["--tiny", "--sentences", "12", "--output_dir", str(tmp_path / "out")])
    report = json.loads((tmp_path / "out" / "decoding.json").read_text(encoding="utf-8"))
    assert report["errors"] == {}
    assert set(report["engines"]) == {
        "ours (GNMT search, vaswani-translate's)", "ours, the decoder's steps lean (fast_cpu's, lean.py)",
        "transformers beam search",
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


def test_each_engine_writes_11_tenths_of_the_longest_source_with_4_beams_from_the_same_sources(tmp_path,
                                                                                               monkeypatch):
    """The work each engine is given: 1.1 x its batch's longest source in new tokens, exactly (min = max), beam 4;
    ours and transformers' from the same padded sources, rows of ordinary ids ending in </s>; the static engine with
    transformers' static cache. The 12 sources are one batch, decoded twice (warm-up, then timed)."""
    searches, generations = [], []
    search, generate = gpu_decoding.gnmt_beam_search, VaswaniForConditionalGeneration.generate

    def searched(model, ids, mask, beams, alpha, **kwargs):
        searches.append((ids, beams, alpha, kwargs, "forward" in vars(model.model.decoder)))  # lean.py's in place
        return search(model, ids, mask, beams, alpha, **kwargs)

    def generated(self, **kwargs):
        generations.append((kwargs["input_ids"], kwargs["generation_config"]))
        return generate(self, **kwargs)

    monkeypatch.setattr(gpu_decoding, "gnmt_beam_search", searched)
    monkeypatch.setattr(VaswaniForConditionalGeneration, "generate", generated)
    main(["--tiny", "--sentences", "12", "--output_dir", str(tmp_path / "out")])
    ids = searches[0][0]
    lengths = ids.ne(PAD).sum(1)
    n = round(1.1 * int(lengths.max()))
    assert len(ids) == 12 and [search[1:] for search in searches] == [
        (4, 0.6, {"max_new_tokens": n, "min_new_tokens": n}, lean) for lean in (False, False, True, True)]
    assert all(torch.equal(search[0], ids) for search in searches)
    assert all(row[length - 1] == EOS and bool((row[:length - 1] >= 4).all()) for row, length in zip(ids, lengths))
    assert json.loads((tmp_path / "out" / "decoding.json").read_text(encoding="utf-8"))["new_tokens"] == 12 * n
    assert len(generations) == 4
    for (input_ids, config), static in zip(generations, (False, False, True, True), strict=True):
        assert torch.equal(input_ids, ids) and (config.num_beams, config.min_new_tokens, config.max_new_tokens) == (
            4, n, n)
        assert config.cache_implementation == ("static" if static else None)


def test_ctranslate2_is_given_the_sources_without_their_eos_and_the_same_new_tokens():
    """CTranslate2 appends </s> to a source itself; it writes 1.1 x the longest source (5 ids with </s>: 6 tokens)."""
    seen = {}

    class Translator:
        def translate_batch(self, tokens, **options):
            seen.update(tokens=tokens, **options)
            return [SimpleNamespace(hypotheses=[["7"] * options["max_decoding_length"]]) for _ in tokens]

    gpu_decoding.ct2(Translator(), [[5, 6, 2], [7, 8, 9, 10, 2]])
    assert seen == {"tokens": [["5", "6"], ["7", "8", "9", "10"]], "beam_size": 4, "min_decoding_length": 6,
                    "max_decoding_length": 6, "length_penalty": 0.6}


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
