"""§6.1 evaluation: decode with the paper's beam search and score with sacreBLEU and chrF (offline)."""

from functools import cache
from pathlib import Path

import evaluate
import torch

from vaswani_hf.gnmt import gnmt_beam_search

METRIC = Path(__file__).resolve().parent / "metrics" / "sacrebleu_chrf"


@torch.no_grad()
def translate(model, tokenizer, sources: list[str], batch_size: int = 64, num_beams: int = 4,
              alpha: float = 0.6) -> list[str]:
    """Translations in the order of `sources`; batches are formed from sources of similar length."""
    model.eval()
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    translations = [""] * len(sources)
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        inputs = tokenizer([sources[i] for i in indices], padding=True, return_tensors="pt").to(device)
        output = gnmt_beam_search(model, inputs["input_ids"], inputs["attention_mask"], num_beams, alpha)
        for i, text in zip(indices, tokenizer.batch_decode(output, skip_special_tokens=True)):
            translations[i] = text
    return translations


@cache
def _metric():
    return evaluate.load(str(METRIC))


def score(predictions: list[str], references: list[str]) -> dict:
    """sacreBLEU and chrF with their signatures."""
    return _metric().compute(predictions=predictions, references=[[r] for r in references])
