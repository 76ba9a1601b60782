"""How many of a finished run's checkpoints to average (§6.1), judged on validation: for each window of the last
K checkpoints, the averaged model's per-token NLL and its beam-4 sacreBLEU at each GNMT α, on the whole set and on
its two harder quarters as `multi30k.py` defines them ("long": the longest sources; "rare": the sources whose words
are rarest in --training_source).

    python benchmarks/averaging_window.py RUN_DIR --windows 15,10,5,3,1 --alphas 1.2,1.4
        [--source ../shared/data/multi30k/valid.en --reference ../shared/data/multi30k/valid.de
         --training_source ../shared/data/multi30k/train.en]

RUN_DIR is a `training/run.py` output folder that still holds its checkpoints (the tokenizer and config come from
it). Use the validation set, never the test set: this chooses `--average_share` and `--average_checkpoints`.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from multi30k import bleu, length_quartiles, rarest_quarter
from transformers import AutoTokenizer

from training.averaging import averaged_model
from training.batching import encode
from training.checkpoints import checkpoints
from training.evaluation import translate, validation_loss
from vaswani_hf import VaswaniConfig
from vaswani_hf.speed.kernels import cpu_name
from vaswani_hf.tools.text import read_lines

DATA = ROOT.parent / "shared" / "data" / "multi30k"


def numbers(text: str, kind=float) -> list:
    return [kind(item) for item in text.split(",")]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--windows", type=lambda text: numbers(text, int), default=[15, 10, 5, 3, 1])
    parser.add_argument("--alphas", type=numbers, default=[1.4])
    parser.add_argument("--source", type=Path, default=DATA / "valid.en")
    parser.add_argument("--reference", type=Path, default=DATA / "valid.de")
    parser.add_argument("--training_source", type=Path, default=DATA / "train.en")
    args = parser.parse_args()
    found = checkpoints(args.run_dir)
    if len(found) < max(args.windows):
        raise SystemExit(f"{args.run_dir}: {len(found)} checkpoints, fewer than the window {max(args.windows)}")
    sources, references = read_lines(args.source), read_lines(args.reference)
    tokenizer = AutoTokenizer.from_pretrained(args.run_dir)
    config = VaswaniConfig.from_pretrained(args.run_dir)
    encoded = encode(tokenizer, list(zip(sources, references, strict=True)))
    sets = {"all": range(len(sources)), "long": length_quartiles(sources)[3],
            "rare": rarest_quarter(sources, read_lines(args.training_source))}
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads; {args.run_dir}: {len(found)} checkpoints")
    for window in args.windows:
        start = time.perf_counter()
        model, averaged = averaged_model(args.run_dir, config, window, print)  # as the run averages its last ones
        nll = validation_loss(model, *encoded, tokenizer.pad_token_id, 2048, "cpu")
        scores = {}
        for alpha in args.alphas:
            hypotheses = translate(model, tokenizer, sources, num_beams=4, alpha=alpha)
            scores[str(alpha)] = {name: round(bleu(hypotheses, references, rows), 2) for name, rows in sets.items()}
        print(json.dumps({"last": window, "from": averaged[0].name, "nll": round(nll, 4), "bleu": scores,
                          "seconds": round(time.perf_counter() - start)}), flush=True)


if __name__ == "__main__":
    main()
