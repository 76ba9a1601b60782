"""How far a finished Multi30k model fits its training data beyond what it generalizes: per-token and per-sentence
NLL (no smoothing) on a sample of the training pairs and on the whole validation set, for our run and the peer's.

    python benchmarks/fit_gap.py RUN_DIR [--peer PEER_DIR] [--sample 1014] [--data DIR]

RUN_DIR is a `training/run.py` output folder; PEER_DIR is the folder `benchmarks/marian_baseline.py` wrote
(`benchmarks/multi30k.py` leaves both in its --output_dir: `ours`, `marian`). DIR holds train and valid, each as
NAME.en + NAME.de (default: Multi30k). Per-token NLLs of different vocabularies do not compare; per-sentence NLLs
(nats a sentence) do. Validation only, never test2016.
"""

import argparse
import json
import random
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from transformers import AutoTokenizer, MarianMTModel, PreTrainedTokenizerFast

from training.batching import encode
from training.evaluation import validation_loss
from vaswani_hf import VaswaniForConditionalGeneration
from vaswani_hf.speed.kernels import cpu_name
from vaswani_hf.tools.text import read_lines

DATA = ROOT.parent / "shared" / "data" / "multi30k"


def pairs(data: Path, split: str) -> list[tuple[str, str]]:
    return list(zip(read_lines(data / f"{split}.en"), read_lines(data / f"{split}.de"), strict=True))


def nll(model, tokenizer, sentence_pairs) -> dict:
    sources, targets = encode(tokenizer, sentence_pairs)
    per_token = validation_loss(model, sources, targets, tokenizer.pad_token_id, 2048, "cpu")
    per_sentence = per_token * sum(map(len, targets)) / len(targets)
    return {"per_token": round(per_token, 4), "per_sentence": round(per_sentence, 2)}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--peer", type=Path)
    parser.add_argument("--sample", type=int, default=1014,
                        help="Training pairs drawn (seed 0); 1,014 = validation's size.")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()
    for folder, needed in [(args.run_dir, "config.json"), (args.peer, "model/config.json"), (args.peer, "tokenizer")]:
        if folder is not None and not (folder / needed).exists():
            raise SystemExit(f"error: {folder / needed} not found: is {folder} a finished run's folder?")
    train = random.Random(0).sample(pairs(args.data, "train"), args.sample)
    valid = pairs(args.data, "valid")
    models = {"ours": (VaswaniForConditionalGeneration.from_pretrained(args.run_dir),
                       AutoTokenizer.from_pretrained(args.run_dir))}
    if args.peer:
        models["peer"] = (MarianMTModel.from_pretrained(args.peer / "model"),
                          PreTrainedTokenizerFast.from_pretrained(args.peer / "tokenizer"))
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads")
    with torch.inference_mode():
        for name, (model, tokenizer) in models.items():
            fit, held_out = nll(model, tokenizer, train), nll(model, tokenizer, valid)
            gap = round(held_out["per_sentence"] - fit["per_sentence"], 2)
            print(json.dumps({"model": name, "train_sample": fit, "valid": held_out, "gap_nats_a_sentence": gap}))


if __name__ == "__main__":
    main()
