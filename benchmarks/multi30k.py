"""Our 25-minute Multi30k recipe against the MarianMTModel + Seq2SeqTrainer peer, side by side on this machine.

    python benchmarks/multi30k.py                                  # cpu-medium and the peer, 25 minutes each
    python benchmarks/multi30k.py --minutes 10 --preset cpu-small  # any preset, any budget
    python benchmarks/multi30k.py --no_test -- --warmup_share 0.2  # choosing: validation only; after --, run.py flags

Runs `training/run.py` with the preset, then the peer (`../shared/baselines/train_marian.py`: d_model 256, 3+3
layers, BPE 8k, beam 4), one after the other with the same training budget on the same CPU, and prints each one's
steps, validation (all 1,014 sentences) and test2016 sacreBLEU and chrF, and the CPU. Both decode with beam 4: ours
with the preset's GNMT α (`cpu-medium`: 1.4, chosen on validation; with `-- --alpha_candidates A B ...` the α the run
chooses on the validation set), the peer with transformers' length penalty 0.6. The folders
and a `comparison.json` stay in --output_dir. `--no_test` leaves test2016 out of both (for making choices);
`--skip_peer` runs ours only.
"""

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from training.arguments import read_preset
from vaswani_hf.kernels import cpu_name

PEER = ROOT.parent / "shared" / "baselines" / "train_marian.py"
DATA = ROOT.parent / "shared" / "data" / "multi30k"


def run(command: list[str], log: Path) -> None:
    print("$", " ".join(command), f"> {log}", flush=True)
    with open(log, "w") as file:
        if subprocess.run(command, check=False, stdout=file, stderr=subprocess.STDOUT, cwd=ROOT).returncode:
            raise SystemExit(f"failed: {' '.join(command)} (see {log})")


def ours(args, out: Path, extra: list[str]) -> dict:
    data = ["--train_file", str(args.data / "train"), "--validation_file", str(args.data / "valid")]
    if not args.no_test:
        data += ["--test_file", str(args.data / "test2016")]
    run(["accelerate", "launch", "--num_processes", "1", "training/run.py", "--preset", args.preset, *data,
         "--max_train_minutes", str(args.minutes), "--output_dir", str(out), *extra], out.with_suffix(".log"))
    metrics = json.loads((out / "metrics.json").read_text())
    alpha = json.loads((out / "generation_config.json").read_text())["gnmt_alpha"]
    row = {"steps": metrics["train_steps"], "valid": metrics["validation"], "alpha": alpha,
           "alpha_search": metrics.get("alpha_search")}
    if "test" in metrics:
        row["test2016"] = metrics["test"]
    return row


def peer(args, out: Path) -> dict:
    command = [sys.executable, str(args.peer), "--data", str(args.data), "--budget_min", str(args.minutes),
               "--out", str(out)]
    run(command, out.with_suffix(".log"))
    results = json.loads((out / "results.json").read_text())
    return {"steps": results["train"]["steps"], "valid": results["eval"]["valid_beam4"],
            "test2016": results["eval"]["test2016_beam4"]}


def positive_minutes(text: str) -> float:
    if not float(text) > 0:
        raise argparse.ArgumentTypeError(f"a training budget must be positive, not {text}")
    return float(text)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=positive_minutes, default=25)
    parser.add_argument("--preset", default="cpu-medium")
    parser.add_argument("--data", type=Path, default=DATA,
                        help="A folder with train, valid and test2016 .en/.de files.")
    parser.add_argument("--peer", type=Path, default=PEER)
    parser.add_argument("--output_dir", type=Path, default=Path("/tmp") / f"multi30k-{time.strftime('%Y%m%d-%H%M%S')}")
    parser.add_argument("--no_test", action="store_true", help="Leave test2016 out: for choosing on validation.")
    parser.add_argument("--skip_peer", action="store_true")
    args, extra = parser.parse_known_args()
    extra = [flag for flag in extra if flag != "--"]
    read_preset(args.preset)  # an unknown preset: one line, before any folder or process
    for name in ("train", "valid", "test2016"):
        if not (args.data / f"{name}.en").is_file():
            raise SystemExit(f"--data {args.data}: no {name}.en")
    if not args.skip_peer and not args.peer.is_file():
        raise SystemExit(f"--peer {args.peer}: no such file")
    if args.no_test and not args.skip_peer:
        raise SystemExit("--no_test: the peer's script always decodes test2016; add --skip_peer")
    if args.output_dir.exists():
        raise SystemExit(f"--output_dir {args.output_dir} exists: name a new one")
    args.output_dir.mkdir(parents=True)

    cpu = cpu_name()
    rows = {f"ours ({args.preset})": ours(args, args.output_dir / "ours", extra)}
    if not args.skip_peer:
        rows["MarianMTModel + Seq2SeqTrainer"] = peer(args, args.output_dir / "marian")
    comparison = {"cpu": cpu, "minutes": args.minutes, "preset": args.preset, "run_flags": extra, "rows": rows}
    (args.output_dir / "comparison.json").write_text(json.dumps(comparison, indent=1))

    print(f"\n{args.minutes:g} minutes of training each, {cpu}")
    print(f"| {'run':<34} | steps | valid sacreBLEU | valid chrF | test2016 sacreBLEU | test2016 chrF |")
    print(f"|{'-' * 36}|------:|---------------:|-----------:|------------------:|--------------:|")
    for name, row in rows.items():
        test = row.get("test2016")
        test_bleu, test_chrf = (f"{test['bleu']:.2f}", f"{test['chrf']:.2f}") if test else ("-", "-")
        print(f"| {name:<34} | {row['steps']:>5} | {row['valid']['bleu']:>14.2f} | {row['valid']['chrf']:>10.2f} | "
              f"{test_bleu:>17} | {test_chrf:>13} |")
    if len(rows) == 2:
        (a, b) = rows.values()
        margins = {split: a[split]["bleu"] - b[split]["bleu"] for split in ("valid", "test2016") if split in a}
        print("ours - peer, sacreBLEU: " + ", ".join(f"{split} {m:+.2f}" for split, m in margins.items()))
    print(f"folders and comparison.json in {args.output_dir}")


if __name__ == "__main__":
    main()
