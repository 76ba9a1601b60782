"""§6.1 evaluation: decode with the paper's beam search and score with sacreBLEU and chrF (offline)."""

from functools import cache
from pathlib import Path

import evaluate

from vaswani_hf.translate import translate  # noqa: F401  (the §6.1 decoding, re-exported for run.py)

METRIC = Path(__file__).resolve().parent / "metrics" / "sacrebleu_chrf"


@cache
def _metric():
    return evaluate.load(str(METRIC))


def score(predictions: list[str], references: list[str]) -> dict:
    """sacreBLEU and chrF with their signatures."""
    return _metric().compute(predictions=predictions, references=[[r] for r in references])
