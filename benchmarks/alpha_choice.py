"""Whether the validation set can choose GNMT α (§6.1) among the candidates, judged on validation only.

    python benchmarks/alpha_choice.py RUN_DIR [RUN_DIR ...] [--alphas 1.2,1.4] [--splits 1000]
        [--source ../shared/data/multi30k/valid.en --reference ../shared/data/multi30k/valid.de]

For each finished `training/run.py` folder, its final model decodes the validation set once per α (by default the
candidates the run chose among; beam 4, as the run decoded), and then, beside each α's BLEU and length ratio:
- sacreBLEU's paired bootstrap (`sacrebleu.significance.PairedTest`, 1,000 resamples) of each α against the best: its
  p-value, the chance of a gap this large between equal systems;
- split halves: the sentences are split at random into two halves, `--splits` times; α is chosen on one half by BLEU
  (the run's rule) and scored on the other half, beside each fixed α scored on that same other half. Printed: the
  held-out half's mean BLEU for each rule, and how often the two halves choose the same α.
If choosing wins nothing over the best fixed α on the held-out halves, the candidates are within validation's noise.
Use the validation set, never the test set: this judges how α is chosen.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch
from sacrebleu.metrics import BLEU
from sacrebleu.significance import PairedTest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from averaging_window import DATA, numbers
from transformers import AutoTokenizer

from training.evaluation import translate
from vaswani_hf import VaswaniForConditionalGeneration
from vaswani_hf.speed.kernels import cpu_name
from vaswani_hf.tools.text import read_lines


def sentence_statistics(hypotheses: list[str], references: list[str]) -> np.ndarray:
    """Per sentence, what corpus BLEU sums: n-gram matches and totals (n = 1..4), hypothesis and reference length."""
    metric = BLEU(effective_order=True)  # only the sentence's own score depends on it, not its counts
    return np.array([[*s.counts, *s.totals, s.sys_len, s.ref_len]
                     for s in (metric.sentence_score(h, [r]) for h, r in zip(hypotheses, references, strict=True))])


def corpus_bleu(statistics: np.ndarray) -> float:
    """sacreBLEU's corpus score (its defaults) from the summed statistics of the sentences given."""
    total = statistics.sum(0).tolist()
    return BLEU.compute_bleu(total[:4], total[4:8], int(total[8]), int(total[9])).score


def split_halves(statistics: dict[float, np.ndarray], splits: int, seed: int) -> dict:
    """Held-out halves' mean BLEU: of α chosen on the other half, and of each α fixed; how often the halves agree."""
    rng, n = np.random.default_rng(seed), len(next(iter(statistics.values())))
    held = {"chosen": 0.0} | {alpha: 0.0 for alpha in statistics}
    agree = 0
    for _ in range(splits):
        order = rng.permutation(n)
        scores = [{alpha: corpus_bleu(rows[half]) for alpha, rows in statistics.items()}
                  for half in (order[: n // 2], order[n // 2:])]
        choices = [max(s, key=s.get) for s in scores]
        agree += choices[0] == choices[1]
        for chooser, scorer in ((0, 1), (1, 0)):
            held["chosen"] += scores[scorer][choices[chooser]] / (2 * splits)
            for alpha in statistics:
                held[alpha] += scores[scorer][alpha] / (2 * splits)
    return {"held_out_bleu": {str(rule): round(value, 2) for rule, value in held.items()},
            "halves_agree": round(agree / splits, 3)}


def paired_bootstrap(decoded: dict[float, list[str]], best: float, references: list[str]) -> dict:
    """p-value of each α against the best α, by sacreBLEU's paired bootstrap."""
    systems = [(str(best), decoded[best])] + [(str(a), hyps) for a, hyps in decoded.items() if a != best]
    _, results = PairedTest(systems, {"BLEU": BLEU()}, [references], test_type="bs")()
    return {name: result.p_value for name, result in zip(results["System"], results["BLEU"]) if name != str(best)}


def alpha_list(text: str) -> list[float]:
    alphas = numbers(text)
    if any(alpha < 0 for alpha in alphas):
        raise argparse.ArgumentTypeError(f"α must be at least 0, not {text}")
    return alphas


def positive(text: str) -> int:
    if int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, not {text}")
    return int(text)


def candidates(run: Path) -> list[float]:
    """The α candidates the run chose among (its metrics.json), checked before any decoding."""
    try:
        metrics = json.loads((run / "metrics.json").read_text(encoding="utf-8"))
        return [float(alpha) for alpha in metrics["alpha_search"]]
    except (OSError, ValueError, KeyError) as error:
        raise SystemExit(f"{run}: not a finished run that chose α ({type(error).__name__}: {error}); "
                         f"give --alphas") from None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", type=Path, nargs="+")
    parser.add_argument("--alphas", type=alpha_list, help="The α to compare (default: the candidates each run had).")
    parser.add_argument("--splits", type=positive, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--source", type=Path, default=DATA / "valid.en")
    parser.add_argument("--reference", type=Path, default=DATA / "valid.de")
    args = parser.parse_args()
    for run in args.run_dirs:  # every input checked before the first decoding
        if not (run / "config.json").is_file():
            raise SystemExit(f"{run}: not a training/run.py output folder (no config.json)")
    alphas = {run: args.alphas or candidates(run) for run in args.run_dirs}
    try:
        sources, references = read_lines(args.source), read_lines(args.reference)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    if len(sources) != len(references):
        raise SystemExit(f"{args.source} has {len(sources)} lines but {args.reference} has {len(references)}")
    print(f"CPU: {cpu_name()}, {torch.get_num_threads()} threads; {len(references)} sentences, {args.splits} splits")
    for run in args.run_dirs:
        tokenizer = AutoTokenizer.from_pretrained(run)
        model = VaswaniForConditionalGeneration.from_pretrained(run).eval()
        decoded = {alpha: translate(model, tokenizer, sources, num_beams=4, alpha=alpha) for alpha in alphas[run]}
        statistics = {alpha: sentence_statistics(hyps, references) for alpha, hyps in decoded.items()}
        full = {alpha: corpus_bleu(rows) for alpha, rows in statistics.items()}
        best = max(full, key=full.get)
        print(json.dumps({
            "run": str(run), "bleu": {str(a): round(value, 2) for a, value in full.items()},
            "length_ratio": {str(a): round(rows[:, 8].sum() / rows[:, 9].sum(), 3) for a, rows in statistics.items()},
            "p_against_best": paired_bootstrap(decoded, best, references),
            **split_halves(statistics, args.splits, args.seed)}), flush=True)


if __name__ == "__main__":
    main()
