"""Our 25-minute Multi30k recipe against the MarianMTModel + Seq2SeqTrainer peer, side by side on this machine.

    python benchmarks/multi30k.py                                  # cpu-medium and the peer, 25 minutes each
    python benchmarks/multi30k.py --minutes 10 --preset cpu-small  # any preset, any budget
    python benchmarks/multi30k.py --no_test -- --warmup_share 0.2  # choosing: validation only; after --, run.py flags
    python benchmarks/multi30k.py --minutes 30 --peer_minutes 34   # each side the steps it makes on another CPU

Runs `training/run.py` with the preset, then the peer (`benchmarks/marian_baseline.py`: d_model 256, 3+3
layers, BPE 8k, beam 4), one after the other with the same training budget (unless `--peer_minutes` gives the peer
another) on the same CPU, and prints each one's steps, validation (all 1,014 sentences) and test2016 sacreBLEU and
chrF, and the CPU. Both decode with beam 4: ours with the preset's GNMT α (`cpu-medium`: 1.4, chosen on validation;
with `-- --alpha_candidates A B ...` the α the run chooses on the validation set), the peer with transformers' length
penalty 0.6. The folders and a `comparison.json` stay in --output_dir. `--no_test` leaves test2016 out of both (for
making choices); `--skip_peer` runs ours only.

Beyond the whole sets, both models' translations are scored by source-length quartile (four bins of equal count, by
source words) and on two harder quarters of validation, the whole of which the 25-minute recipe was found to fit:
"valid-long", the longest sources, and "valid-rare", the sources whose rarest words are rarest in the training
sources (words lowercased, compared by training count). On Multi30k: valid-long is 254 sentences of 14-27 words;
valid-rare 253, each with a word seen at most twice in training, 130 with a word never seen, 81 also in valid-long.
Ours are decoded from the saved model (`vaswani_hf.tools.translate`, as `vaswani-translate` decodes), the peer's
are the files its script writes. `--score_only DIR` scores an earlier run's folders again, training nothing.
"""

import argparse
import json
import re
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sacrebleu.metrics import BLEU

from training.arguments import read_preset
from vaswani_hf.speed.kernels import cpu_name
from vaswani_hf.tools.text import read_lines

PEER = ROOT / "benchmarks" / "marian_baseline.py"
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def run(command: list[str], log: Path) -> None:
    print("$", " ".join(command), f"> {log}", flush=True)
    with open(log, "w", encoding="utf-8") as file:
        if subprocess.run(command, check=False, stdout=file, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
            raise SystemExit(f"failed: {' '.join(command)} (see {log})")


def ours(args, out: Path, extra: list[str]) -> dict:
    data = ["--train_file", str(args.data / "train"), "--validation_file", str(args.data / "valid")]
    if not args.no_test:
        data += ["--test_file", str(args.data / "test2016")]
    run(["accelerate", "launch", "--num_processes", "1", "training/run.py", "--preset", args.preset, *data,
         "--max_train_minutes", str(args.minutes), "--output_dir", str(out), *extra], out.with_suffix(".log"))
    metrics = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    alpha = json.loads((out / "generation_config.json").read_text(encoding="utf-8"))["gnmt_alpha"]
    row = {"steps": metrics["train_steps"], "valid": metrics["validation"], "alpha": alpha,
           "alpha_search": metrics.get("alpha_search")}
    if "test" in metrics:
        row["test2016"] = metrics["test"]
    return row


def peer(args, out: Path) -> dict:
    command = [sys.executable, str(args.peer), "--data", str(args.data), "--budget_min", str(args.peer_minutes),
               "--out", str(out)]
    run(command, out.with_suffix(".log"))
    results = json.loads((out / "results.json").read_text(encoding="utf-8"))
    return {"steps": results["train"]["steps"], "valid": results["eval"]["valid_beam4"],
            "test2016": results["eval"]["test2016_beam4"]}


def length_quartiles(sources: list[str]) -> list[list[int]]:
    """Sentence indices in four bins of equal count by source length in words, shortest first."""
    order = sorted(range(len(sources)), key=lambda i: len(sources[i].split()))
    return [sorted(order[k * len(order) // 4:(k + 1) * len(order) // 4]) for k in range(4)]


def words(sentence: str) -> list[str]:
    return re.findall(r"\w+", sentence.lower())


def rarest_quarter(sources: list[str], training_sources: list[str]) -> list[int]:
    """The indices of the quarter of `sources` whose words are rarest in `training_sources`: sentences ordered by
    their words' training counts, each sentence's sorted smallest first (its rarest word decides, then the next)."""
    counts = Counter(word for sentence in training_sources for word in words(sentence))
    order = sorted(range(len(sources)), key=lambda i: sorted(counts[word] for word in words(sources[i])))
    return sorted(order[:len(order) // 4])


def bleu(hypotheses: list[str], references: list[str], rows) -> float:
    return BLEU().corpus_score([hypotheses[i] for i in rows], [[references[i] for i in rows]]).score


def scored(hypotheses: list[str], references: list[str], sources: list[str]) -> dict:
    """sacreBLEU of the whole set and of each source-length quartile (with its range of source words)."""
    bins = length_quartiles(sources)
    return {"bleu": bleu(hypotheses, references, range(len(sources))),
            "quartiles": [bleu(hypotheses, references, rows) for rows in bins],
            "quartile_words": [[min(words), max(words)] for words in ([len(sources[i].split()) for i in rows]
                                                                      for rows in bins)]}


def translations(args, out: Path, name: str, split: str) -> list[str]:
    """A model's beam-4 translations of `split`: ours decoded from its folder (once, then read), the peer's file."""
    if not name.startswith("ours"):
        return read_lines(out / f"{split}_beam4.hyp.de")
    path = out / f"{split}.hyp.de"
    if not path.is_file():
        from vaswani_hf.tools.translate import load, translate

        model, tokenizer = load(str(out), device="cpu")
        found = translate(model, tokenizer, read_lines(args.data / f"{split}.en"))
        path.write_text("".join(line + "\n" for line in found), encoding="utf-8")
    return read_lines(path)


def harder_sets(args, rows: dict, folders: dict) -> None:
    """Each row gets valid-long, valid-rare and the length quartiles of valid and test2016."""
    rare = rarest_quarter(read_lines(args.data / "valid.en"), read_lines(args.data / "train.en"))
    for name, row in rows.items():
        for split in ("valid", "test2016"):
            if split == "test2016" and args.no_test:
                continue
            sources, references = (read_lines(args.data / f"{split}.{lang}") for lang in ("en", "de"))
            hypotheses = translations(args, folders[name], name, split)
            found = scored(hypotheses, references, sources)
            row[f"{split}_by_length"] = found
            if split == "valid":
                row["valid_long"] = found["quartiles"][3]
                row["valid_rare"] = bleu(hypotheses, references, rare)


def positive_minutes(text: str) -> float:
    if not float(text) > 0:
        raise argparse.ArgumentTypeError(f"a training budget must be positive, not {text}")
    return float(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=positive_minutes, default=25)
    parser.add_argument("--peer_minutes", type=positive_minutes,
                        help="The peer's budget (default: --minutes): to stand in for a CPU on which the two models "
                             "make other numbers of steps than here.")
    parser.add_argument("--preset", default="cpu-medium")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="A folder with train, valid and test2016 .en/.de files.")
    parser.add_argument("--peer", type=Path, default=PEER)
    parser.add_argument("--output_dir", type=Path, default=Path("/tmp") / f"multi30k-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--no_test", action="store_true", help="Leave test2016 out: for choosing on validation.")
    parser.add_argument("--skip_peer", action="store_true")
    parser.add_argument("--score_only", type=Path, metavar="DIR",
                        help="Score the folders of an earlier run (its comparison.json, ours/, marian/) again.")
    args, extra = parser.parse_known_args()
    extra = [flag for flag in extra if flag != "--"]
    args.peer_minutes = args.peer_minutes or args.minutes
    read_preset(args.preset)  # an unknown preset: one line, before any folder or process
    for name in ("train", "valid", "test2016"):
        if not (args.data / f"{name}.en").is_file():
            raise SystemExit(f"--data {args.data}: no {name}.en")
    if not args.skip_peer and not args.peer.is_file():
        raise SystemExit(f"--peer {args.peer}: no such file")
    if args.no_test and not args.skip_peer:
        raise SystemExit("--no_test: the peer's script always decodes test2016; add --skip_peer")

    if args.score_only:
        args.output_dir = args.score_only
        comparison = json.loads((args.output_dir / "comparison.json").read_text(encoding="utf-8"))
        rows = comparison["rows"]
    else:
        if args.output_dir.exists():
            raise SystemExit(f"--output_dir {args.output_dir} exists: name a new one")
        args.output_dir.mkdir(parents=True)
        rows = {f"ours ({args.preset})": ours(args, args.output_dir / "ours", extra)}
        if not args.skip_peer:
            rows["MarianMTModel + Seq2SeqTrainer"] = peer(args, args.output_dir / "marian")
        comparison = {"cpu": cpu_name(), "minutes": args.minutes, "peer_minutes": args.peer_minutes,
                      "preset": args.preset, "run_flags": extra, "rows": rows}
    # kept if scoring fails
    (args.output_dir / "comparison.json").write_text(json.dumps(comparison, indent=1), encoding="utf-8")
    folders = {name: args.output_dir / ("ours" if name.startswith("ours") else "marian") for name in rows}
    harder_sets(args, rows, folders)
    (args.output_dir / "comparison.json").write_text(json.dumps(comparison, indent=1), encoding="utf-8")
    print_table(comparison)
    print(f"folders and comparison.json in {args.output_dir}")


def print_table(comparison: dict) -> None:
    rows = comparison["rows"]
    minutes, peer_minutes = comparison["minutes"], comparison.get("peer_minutes", comparison["minutes"])
    budget = f"{minutes:g} minutes of training each" if minutes == peer_minutes else \
        f"{minutes:g} minutes of training, the peer {peer_minutes:g}"
    print(f"\n{budget}, {comparison['cpu']}")
    print(f"| {'run':<34} | steps | valid | valid-long | valid-rare | test2016 | test2016 by source-length quartile |")
    print(f"|{'-' * 36}|------:|------:|-----------:|-----------:|---------:|------------------------------------|")
    for name, row in rows.items():
        test = row.get("test2016_by_length")
        test_bleu = f"{test['bleu']:.2f}" if test else "-"
        bins = " / ".join(f"{value:.2f}" for value in test["quartiles"]) if test else "-"
        print(f"| {name:<34} | {row['steps']:>5} | {row['valid']['bleu']:>5.2f} | {row['valid_long']:>10.2f} | "
              f"{row['valid_rare']:>10.2f} | {test_bleu:>8} | {bins:<34} |")
    if test := next(iter(rows.values())).get("test2016_by_length"):
        edges = ", ".join(f"{low}-{high}" for low, high in test["quartile_words"])
        print(f"test2016 quartiles, source words: {edges}")
    if len(rows) == 2:
        (a, b) = rows.values()
        margins = {"valid": a["valid"]["bleu"] - b["valid"]["bleu"], "valid-long": a["valid_long"] - b["valid_long"],
                   "valid-rare": a["valid_rare"] - b["valid_rare"]}
        if "test2016_by_length" in a:
            margins["test2016"] = a["test2016_by_length"]["bleu"] - b["test2016_by_length"]["bleu"]
            margins |= {f"test2016 Q{k + 1}": x - y for k, (x, y) in enumerate(
                zip(a["test2016_by_length"]["quartiles"], b["test2016_by_length"]["quartiles"], strict=True))}
        print("ours - peer, sacreBLEU: " + ", ".join(f"{split} {m:+.2f}" for split, m in margins.items()))


if __name__ == "__main__":
    main()
