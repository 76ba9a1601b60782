"""Decoding on one GPU, the paper's base model: sentences/s of our beam search as `vaswani-translate` runs it, beside
transformers' beam search (dynamic cache, and static cache compiled) and our model's CTranslate2 export.

    python benchmarks/gpu_decoding.py --output_dir runs/decoding           # on a GPU: 3,000 sentences
    python benchmarks/gpu_decoding.py --tiny --output_dir runs/decoding    # on a CPU: tiny sizes, the same code

Ours twice: the decoder's steps as the model file computes them, and as `fast_cpu`'s lean step does (fewer Python calls
a step: whether the host, not the GPU, paces decoding). Sources: random ids with lengths drawn like WMT14 EN-DE's
(benchmarks/utilisation.py), batched as `vaswani-translate` batches them (sorted by length, at most 4,096 source tokens
a batch). A model of random weights seldom ends a sentence, so every engine is made to write exactly 1.1 x the batch's
longest source in new tokens (the targets' share in WMT14): the same work in each, about the length real translations
have. Beam 4 in each; ours with the GNMT penalty (α 0.6), the others with their own (the scores do not change the
work). Float32 with TF32 allowed, as `vaswani-translate` runs on a GPU; CTranslate2 also in float16 and int8 (its GPU
compute types), where its package finds the CUDA libraries it was built for (else the error is reported, and the rest
runs; on the lent GPU machine benchmarks/gpu_session.sh offers it the image's cuBLAS 13 under the CUDA 12 name it
opens). The report names the cuBLAS files the process ran on.

Writes decoding.json and decoding.md to --output_dir.
"""

import argparse
import contextlib
import datetime
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch
from gpu_check import device_name, output_and_device, synchronize
from speed import BOS, EOS, PAD, SIZES, build, scratch_folder
from transformers import GenerationConfig
from utilisation import wmt_like_pairs

from vaswani_hf.gnmt import gnmt_beam_search
from vaswani_hf.speed.kernels import cpu_name
from vaswani_hf.speed.lean import lean_block
from vaswani_hf.tools.translate import MAX_TOKENS, token_batches

TINY = {"size": {"d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 64, "vocab_size": 300}, "sentences": 40}
BEAMS, ALPHA, TARGET_SHARE = 4, 0.6, 1.1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output_dir", required=True, help="a new or empty folder")
    parser.add_argument("--tiny", action="store_true", help="tiny sizes, on any device (the tests' way)")
    parser.add_argument("--sentences", type=int, default=None, help="sources decoded (default 3,000; --tiny 40)")
    args = parser.parse_args(argv)
    if args.sentences is not None and args.sentences < 1:
        raise SystemExit(f"error: --sentences {args.sentences}: must be at least 1")
    output_dir, device = output_and_device(args.output_dir, args.tiny)
    output_dir.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    size = TINY["size"] if args.tiny else SIZES["base"]
    sentences = args.sentences or (TINY["sentences"] if args.tiny else 3000)

    model = build("ours", size).to(device).eval()
    lengths, _ = wmt_like_pairs(sentences, size["vocab_size"])
    generator = torch.Generator().manual_seed(2)
    sources = [torch.randint(4, size["vocab_size"], (int(n),), generator=generator).tolist()[:-1] + [EOS]
               for n in lengths]
    batches = [[sources[i] for i in batch] for batch in token_batches([len(s) for s in sources], MAX_TOKENS)]
    engines = {"ours (GNMT search, vaswani-translate's)": lambda batch: ours(model, batch, device),
               "ours, the decoder's steps lean (fast_cpu's, lean.py)": lambda batch: ours(model, batch, device,
                                                                                         lean=True),
               "transformers beam search": lambda batch: transformers_beams(model, batch, device, static=False),
               "transformers beam search, static cache (compiled on a GPU)": lambda batch: transformers_beams(
                   model, batch, device, static=True)}
    report = {"date": datetime.date.today().isoformat(), "device": device_name(device), "host": cpu_name(),
              "torch": torch.__version__, "sentences": sentences, "batches": len(batches),
              "new_tokens": sum(len(batch) * new_tokens(batch) for batch in batches), "engines": {}, "errors": {}}
    try:
        engines.update(ctranslate2_engines(model, device))
    except Exception as error:  # noqa: BLE001 - a missing CUDA library of CTranslate2's is a finding, reported
        report["errors"]["ctranslate2"] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
    for name, engine in engines.items():
        try:
            report["engines"][name] = timed(engine, batches, device)
        except Exception as error:  # noqa: BLE001 - every engine runs; what broke is reported
            report["errors"][name] = f"{type(error).__name__}: {str(error).strip().splitlines()[0][:300]}"
        print(f"gpu_decoding: {name}: {report['engines'].get(name, report['errors'].get(name))}", flush=True)
    report["cublas"] = mapped_files("libcublas")
    (output_dir / "decoding.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (output_dir / "decoding.md").write_text(markdown(report), encoding="utf-8")
    print((output_dir / "decoding.md").read_text(encoding="utf-8"))
    return 0


def mapped_files(name: str) -> list[str]:
    """The files whose names hold `name` among those this process has mapped (Linux; else none)."""
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8").splitlines()
    except OSError:
        return []
    return sorted({path for path in (line.split()[-1] for line in maps) if name in Path(path).name})


def new_tokens(batch: list[list[int]]) -> int:
    return round(TARGET_SHARE * max(map(len, batch)))


def padded(batch: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(map(len, batch))
    ids = torch.tensor([row + [PAD] * (width - len(row)) for row in batch], device=device)
    return ids, ids.ne(PAD).long()


def ours(model, batch: list[list[int]], device: torch.device, lean: bool = False) -> None:
    """The paper's search, the decoder's steps by its own forward, or with `lean` by lean.py's (fewer Python calls a
    step: whether the host paces a GPU's decoding)."""
    ids, mask = padded(batch, device)
    n = new_tokens(batch)
    with lean_block(model.model.decoder) if lean else contextlib.nullcontext():
        output = gnmt_beam_search(model, ids, mask, BEAMS, ALPHA, max_new_tokens=n, min_new_tokens=n)
    assert output.shape[1] == n + 1, output.shape


def transformers_beams(model, batch: list[list[int]], device: torch.device, static: bool) -> None:
    ids, mask = padded(batch, device)
    n = new_tokens(batch)
    config = GenerationConfig(num_beams=BEAMS, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                              early_stopping=True, pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
                              decoder_start_token_id=BOS, cache_implementation="static" if static else None)
    output = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    assert output.shape[1] == n + 1, output.shape


def ctranslate2_engines(model, device: torch.device) -> dict:
    """Our model exported as `vaswani-export ctranslate2` does it, loaded on this device in its compute types."""
    import ctranslate2

    from vaswani_hf.exports.to_ctranslate2 import VaswaniConverter

    vocab = {str(i): i for i in range(model.config.vocab_size)}  # no tokenizer: the ids' strings are the tokens
    tokens = SimpleNamespace(get_vocab=lambda: vocab, bos_token=str(BOS), eos_token=str(EOS), unk_token="3",
                             convert_ids_to_tokens=str)
    folder = f"{scratch_folder()}/ctranslate2"
    VaswaniConverter(model.cpu(), tokens).convert(folder)
    model.to(device)
    types = ("float32", "float16", "int8_float16") if device.type == "cuda" else ("float32", "int8")
    engines, threads = {}, torch.get_num_threads()
    for compute in types:  # on a CPU, on torch's threads (CTranslate2 sets OpenMP's count: torch's is set back)
        translator = ctranslate2.Translator(folder, device=device.type, compute_type=compute, intra_threads=threads)
        engines[f"CTranslate2 export, {compute}"] = lambda batch, t=translator: ct2(t, batch)
    torch.set_num_threads(threads)
    return engines


def ct2(translator, batch: list[list[int]]) -> None:
    n = new_tokens(batch)
    results = translator.translate_batch([[str(i) for i in row[:-1]] for row in batch], beam_size=BEAMS,
                                         min_decoding_length=n, max_decoding_length=n, length_penalty=ALPHA)
    assert all(len(result.hypotheses[0]) == n for result in results), [len(r.hypotheses[0]) for r in results]


def timed(engine, batches: list, device: torch.device) -> dict:
    """Sentences/s over all batches, after one batch decoded to warm up (and, for the compiled engine, to compile:
    its seconds reported)."""
    synchronize(device)
    started = time.perf_counter()
    engine(batches[0])
    synchronize(device)
    warmup = time.perf_counter() - started
    started = time.perf_counter()
    for batch in batches:
        engine(batch)
    synchronize(device)
    seconds = time.perf_counter() - started
    return {"sentences_per_second": sum(map(len, batches)) / seconds, "seconds": seconds,
            "first_batch_seconds": warmup}


def markdown(report: dict) -> str:
    title = (f"**{report['device']}**, {report['date']}; host {report['host']}; torch {report['torch']}; "
             f"{report['sentences']} sources in {report['batches']} batches, {report['new_tokens']:,} new tokens a "
             f"beam, beam {BEAMS}")
    lines = [title, "", "| engine | sentences/s | over ours | first batch, s |", "|---|---:|---:|---:|"]
    ours_rate = next((e["sentences_per_second"] for name, e in report["engines"].items() if name.startswith("ours")),
                     None)
    for name, engine in report["engines"].items():
        over = f"{engine['sentences_per_second'] / ours_rate:.2f}x" if ours_rate else "–"
        rate, first = engine["sentences_per_second"], engine["first_batch_seconds"]
        lines.append(f"| {name} | {rate:.1f} | {over} | {first:.1f} |")
    lines += [f"\n{name} FAILED: {error}" for name, error in report["errors"].items()]
    if report["cublas"]:
        lines.append(f"\ncuBLAS loaded: {', '.join(report['cublas'])}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
