"""§6.1 evaluation: decode with the paper's beam search and score with sacreBLEU and chrF (offline)."""

import math
from functools import cache
from pathlib import Path

import evaluate
import torch

from training.batching import collate, token_batches
from training.loss import label_smoothed_nll
from vaswani_hf.tools.translate import translate

METRIC = Path(__file__).resolve().parent / "metrics" / "sacrebleu_chrf"


@cache
def _metric():
    return evaluate.load(str(METRIC))


def score(predictions: list[str], references: list[str]) -> dict:
    """sacreBLEU and chrF with their signatures."""
    return _metric().compute(predictions=predictions, references=[[r] for r in references])


@torch.no_grad()
def validation_loss(model, sources, targets, pad_id, max_tokens, device) -> float:
    """Per-token NLL on the validation set (no smoothing), for perplexity; the model's mode is given back."""
    training = model.training
    model.eval()
    total = count = 0.0
    for batch in token_batches([len(s) for s in sources], [len(t) for t in targets], max_tokens, seed=0, epoch=0):
        inputs = collate(batch, sources, targets, pad_id, device)
        logits = model(**inputs).logits
        _, nll, n = label_smoothed_nll(logits, inputs["labels"], 0.0)
        total, count = total + nll.item(), count + n.item()
    model.train(training)
    return total / max(count, 1)


def choose_alpha(model, tokenizer, pairs, args) -> dict[float, dict]:
    """sacreBLEU and chrF of the pairs for each candidate GNMT α, or for --length_penalty_alpha alone (§6.1: α was
    "chosen after experimentation on the development set")."""
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    return {alpha: score(translate(model, tokenizer, sources, num_beams=args.num_beams, alpha=alpha), references)
            for alpha in args.alpha_candidates or [args.length_penalty_alpha]}


def evaluate_model(model, tokenizer, pairs, encoded, args, sentences=None) -> dict:
    """Validation loss on every pair; BLEU and chrF on the first `sentences` (--eval_max_sentences)."""
    loss = validation_loss(model, *encoded, tokenizer.pad_token_id, args.max_tokens, next(model.parameters()).device)
    subset = pairs[: sentences or args.eval_max_sentences]
    predictions = translate(model, tokenizer, [s for s, _ in subset], num_beams=args.num_beams,
                            alpha=args.length_penalty_alpha)
    metrics = score(predictions, [t for _, t in subset])
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), **metrics}


def final_evaluation(final, tokenizer, pairs, validation, args, say) -> tuple[dict, float]:
    """The final model on the whole validation set, decoded with each candidate α (§6.1), then on the test set once,
    with the winner: the metrics and the α chosen (--length_penalty_alpha without a validation set)."""
    metrics, alpha = {}, args.length_penalty_alpha
    device = next(final.parameters()).device
    if validation:
        scores = choose_alpha(final, tokenizer, pairs["validation"], args)
        alpha = max(scores, key=lambda candidate: scores[candidate]["bleu"])  # one candidate: that one
        if len(scores) > 1:
            metrics["alpha_search"] = {candidate: scored["bleu"] for candidate, scored in scores.items()}
            searched = ", ".join(f"{candidate}: {bleu:.2f}" for candidate, bleu in metrics["alpha_search"].items())
            say(f"GNMT α by validation BLEU: {searched} -> {alpha}")
        loss = validation_loss(final, *validation, tokenizer.pad_token_id, args.max_tokens, device)
        metrics["validation"] = {"loss": loss, "perplexity": math.exp(min(loss, 50)), **scores[alpha]}
        say(f"validation: sacreBLEU {metrics['validation']['bleu']:.1f}  chrF {metrics['validation']['chrf']:.1f}")
    if "test" in pairs:
        sources = [s for s, _ in pairs["test"]]
        predictions = translate(final, tokenizer, sources, num_beams=args.num_beams, alpha=alpha)
        metrics["test"] = score(predictions, [t for _, t in pairs["test"]])
        say(f"test: sacreBLEU {metrics['test']['bleu']:.1f}  chrF {metrics['test']['chrf']:.1f}  "
            f"({metrics['test']['bleu_signature']})")
        for source, prediction in list(zip(sources, predictions))[:5]:
            say(f"  {source}\n  -> {prediction}")
    return metrics, alpha
