"""What int8 inference (`vaswani_hf.quantize_int8`) costs in BLEU and gains in speed on a trained model.

Translates a test set twice with the paper's decoding (the model's saved beam size and GNMT α): with the float32
model and with its int8 copy, each loaded and transformed by `fast_cpu` as `vaswani-translate` (`--int8`) does, on the
CPU, and prints sacreBLEU, chrF and sentences/s of each.

    python benchmarks/int8_bleu.py outputs/m30k --source test2016.en --reference test2016.de
"""

import argparse
import sys
import time
from pathlib import Path

import torch

from vaswani_hf.speed.kernels import cpu_name
from vaswani_hf.tools.translate import load, translate

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.evaluation import score


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="A model folder written by training/run.py, or a Hub repository id.")
    parser.add_argument("--source", required=True, help="One source sentence per line.")
    parser.add_argument("--reference", required=True, help="One reference translation per line.")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    for path in (args.source, args.reference):
        if not Path(path).is_file():
            raise SystemExit(f"error: {path}: no such file")
    sources = Path(args.source).read_text(encoding="utf-8").splitlines()
    references = Path(args.reference).read_text(encoding="utf-8").splitlines()
    if len(sources) != len(references):
        raise SystemExit(f"error: {len(sources)} sources but {len(references)} references")
    model, tokenizer = load(args.model, "cpu")
    alpha = getattr(model.generation_config, "gnmt_alpha", None)
    print(f"{cpu_name()}, {args.threads} threads; {len(sources)} sentences, beam {model.generation_config.num_beams}, "
          + (f"GNMT α {alpha}" if alpha is not None else "transformers' beam search"))
    print("| model | sacreBLEU | chrF | sentences/s |")
    print("|---|---:|---:|---:|")
    int8, _ = load(args.model, "cpu", int8=True)  # as `vaswani-translate --int8` decodes
    for name, variant in (("float32", model), ("int8", int8)):
        start = time.perf_counter()
        translations = translate(variant, tokenizer, sources)
        seconds = time.perf_counter() - start
        metrics = score(translations, references)
        print(f"| {name} | {metrics['bleu']:.2f} | {metrics['chrf']:.2f} | {len(sources) / seconds:.1f} |")
    print(f"signature {metrics['bleu_signature']}")


if __name__ == "__main__":
    main()
