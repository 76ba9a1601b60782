"""A local `evaluate` metric: corpus sacreBLEU and chrF with their signatures, computed by sacrebleu; with
`moses_lang`, also BLEU as the paper's Table 2 was scored (tensor2tensor's get_ende_bleu.sh): both sides tokenized by
Moses' tokenizer for that language, compounds split ("rich-text" -> "rich ##AT##-##AT## text"), multi-bleu.perl's
unsmoothed BLEU of the tokens. sacremoses is Moses' tokenizer.perl as it was in 2017 (before final dots were split
unconditionally, 2018).

`evaluate.load("sacrebleu")` fetches its script from the Hub at run time; this module needs no network:
`evaluate.load("training/metrics/sacrebleu_chrf")`.
"""

import re
from importlib.metadata import version

import datasets
import evaluate
import sacrebleu
from sacremoses import MosesTokenizer


def table2_tokens(texts: list[str], lang: str) -> list[str]:
    """`texts` as Table 2's BLEU reads them: tokenized by Moses for `lang` (special characters escaped, as
    tokenizer.perl does), then each hyphen between two non-spaces set apart, left to right, a match not overlapping
    the one before (tensor2tensor's `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'`)."""
    moses = MosesTokenizer(lang=lang)
    return [re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", moses.tokenize(text, return_str=True, escape=True))
            for text in texts]


class SacrebleuChrf(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Corpus BLEU and chrF from sacrebleu, with their reproducibility signatures; with moses_lang, "
                        "BLEU of Moses' tokens, compounds split, as the Transformer paper's Table 2.",
            citation="Post, 2018. A Call for Clarity in Reporting BLEU Scores.",
            inputs_description="predictions: list of strings; references: list of lists of strings "
                               "(one list per prediction, all the same length).",
            features=datasets.Features(
                {"predictions": datasets.Value("string"),
                 "references": datasets.Sequence(datasets.Value("string"), id="references")}
            ),
        )

    def _compute(self, predictions, references, tokenize: str = "13a", moses_lang: str | None = None):
        if len({len(refs) for refs in references}) > 1:
            raise ValueError("every prediction needs the same number of references")
        streams = [list(stream) for stream in zip(*references)]  # sacrebleu wants one stream per reference
        bleu = sacrebleu.metrics.BLEU(tokenize=tokenize)
        chrf = sacrebleu.metrics.CHRF()
        bleu_score = bleu.corpus_score(predictions, streams)
        chrf_score = chrf.corpus_score(predictions, streams)
        scores = {
            "bleu": bleu_score.score,
            "chrf": chrf_score.score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
        }
        if moses_lang is not None:
            tokenized = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
            token_streams = [table2_tokens(stream, moses_lang) for stream in streams]
            scores["bleu_tokenized"] = tokenized.corpus_score(table2_tokens(predictions, moses_lang),
                                                              token_streams).score
            scores["bleu_tokenized_signature"] = (f"moses:{moses_lang}|compounds:split|sacremoses:"
                                                  f"{version('sacremoses')}|{tokenized.get_signature()}")
        return scores
