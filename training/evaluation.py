"""§6.1 evaluation: decode with the paper's beam search and score with sacreBLEU and chrF (offline), and the final
model's translations as Table 2's BLEU was scored too (tokenized, compounds split); a parser's linearized trees
(--evalb) with EVALB's bracketing F1 too (§6.3)."""

import math
from functools import cache
from pathlib import Path

import evaluate
import torch

from training.batching import collate, token_batches
from training.loss import label_smoothed_nll
from vaswani_hf.tools.translate import translate

METRICS = Path(__file__).resolve().parent / "metrics"


@cache
def _metric(name: str):
    return evaluate.load(str(METRICS / name))


def score(predictions: list[str], references: list[str], trees: bool = False, lang: str | None = None) -> dict:
    """sacreBLEU and chrF with their signatures; with `trees`, EVALB's scores of the linearized trees as well; with a
    target language `lang` (translations), BLEU as the paper's Table 2 (`bleu_tokenized`, sacrebleu_chrf.py)."""
    scores = _metric("sacrebleu_chrf").compute(predictions=predictions, references=[[r] for r in references],
                                               moses_lang=None if trees else lang)
    if trees:
        scores |= _metric("evalb").compute(predictions=predictions, references=references)
    return scores


def reported(scores: dict) -> str:
    """The scores as a run prints them."""
    evalb = (f"EVALB F1 {scores['bracket_f1']:.1f} ({scores['skipped']} skipped; {scores['bracket_f1_all']:.1f} with "
             "their constituents missed)  ") if "bracket_f1" in scores else ""
    tokenized = f"  tokenized BLEU {scores['bleu_tokenized']:.1f}" if "bleu_tokenized" in scores else ""
    return f"{evalb}sacreBLEU {scores['bleu']:.1f}  chrF {scores['chrf']:.1f}{tokenized}"


def check_trees(data: dict, evalb: bool) -> None:
    """With --evalb, a validation or test split whose first targets close no constituent (`/X`) is a one-line
    SystemExit: they are not linearized trees."""
    for split in ("validation", "test"):
        if evalb and split in data and not any(token.startswith("/") for row in data[split].take(100)
                                                for token in row["target"].split()):
            raise SystemExit(f"error: --evalb: the {split} targets are not linearized trees (none closes a "
                             "constituent with /X): make them with training/treebank.py")


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


def choose_alpha(model, tokenizer, pairs, args, lang: str | None = None) -> dict[float, dict]:
    """The scores of the pairs for each candidate GNMT α, or for --length_penalty_alpha alone (§6.1: α was "chosen
    after experimentation on the development set")."""
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    return {alpha: score(translate(model, tokenizer, sources, num_beams=args.num_beams, alpha=alpha), references,
                         args.evalb, lang)
            for alpha in args.alpha_candidates or [args.length_penalty_alpha]}


def evaluate_model(model, tokenizer, pairs, encoded, args) -> dict:
    """Validation loss on every pair; BLEU and chrF (with --evalb, EVALB's scores too) on the first
    --eval_max_sentences."""
    loss = validation_loss(model, *encoded, tokenizer.pad_token_id, args.max_tokens, next(model.parameters()).device)
    subset = pairs[: args.eval_max_sentences]
    predictions = translate(model, tokenizer, [s for s, _ in subset], num_beams=args.num_beams,
                            alpha=args.length_penalty_alpha)
    metrics = score(predictions, [t for _, t in subset], args.evalb)
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), **metrics}


def final_evaluation(final, tokenizer, pairs, validation, args, say, lang: str) -> tuple[dict, float]:
    """The final model on the whole validation set, decoded with each candidate α (§6.1), then on the test set once,
    with the winner: the metrics and the α chosen (--length_penalty_alpha without a validation set). `lang`: the
    target language, whose Moses tokenizer Table 2's BLEU reads."""
    metrics, alpha = {}, args.length_penalty_alpha
    device = next(final.parameters()).device
    if validation:
        scores = choose_alpha(final, tokenizer, pairs["validation"], args, lang)
        key = "bracket_f1_all" if args.evalb else "bleu"  # a parser's α by F1, skipped sentences counted
        alpha = max(scores, key=lambda candidate: scores[candidate][key])  # one candidate: that one
        if len(scores) > 1:
            metrics["alpha_search"] = {candidate: scored[key] for candidate, scored in scores.items()}
            searched = ", ".join(f"{candidate}: {value:.2f}" for candidate, value in metrics["alpha_search"].items())
            by = "F1, skipped sentences missed" if args.evalb else "BLEU"
            say(f"GNMT α by validation {by}: {searched} -> {alpha}")
        loss = validation_loss(final, *validation, tokenizer.pad_token_id, args.max_tokens, device)
        metrics["validation"] = {"loss": loss, "perplexity": math.exp(min(loss, 50)), **scores[alpha]}
        say(f"validation: {reported(metrics['validation'])}  perplexity {metrics['validation']['perplexity']:.2f}")
    if "test" in pairs:
        sources = [s for s, _ in pairs["test"]]
        predictions = translate(final, tokenizer, sources, num_beams=args.num_beams, alpha=alpha)
        metrics["test"] = score(predictions, [t for _, t in pairs["test"]], args.evalb, lang)
        say(f"test: {reported(metrics['test'])}  ({metrics['test']['bleu_signature']})")
        for source, prediction in list(zip(sources, predictions))[:5]:
            say(f"  {source}\n  -> {prediction}")
    return metrics, alpha
