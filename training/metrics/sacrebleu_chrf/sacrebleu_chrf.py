"""A local `evaluate` metric: corpus sacreBLEU and chrF with their signatures, computed by sacrebleu.

`evaluate.load("sacrebleu")` fetches its script from the Hub at run time; this module needs no network:
`evaluate.load("training/metrics/sacrebleu_chrf")`.
"""

import datasets
import evaluate
import sacrebleu


class SacrebleuChrf(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="Corpus BLEU and chrF from sacrebleu, with their reproducibility signatures.",
            citation="Post, 2018. A Call for Clarity in Reporting BLEU Scores.",
            inputs_description="predictions: list of strings; references: list of lists of strings "
                               "(one list per prediction, all the same length).",
            features=datasets.Features(
                {"predictions": datasets.Value("string"),
                 "references": datasets.Sequence(datasets.Value("string"), id="references")}
            ),
        )

    def _compute(self, predictions, references, tokenize: str = "13a"):
        if len({len(refs) for refs in references}) > 1:
            raise ValueError("every prediction needs the same number of references")
        streams = [list(stream) for stream in zip(*references)]  # sacrebleu wants one stream per reference
        bleu = sacrebleu.metrics.BLEU(tokenize=tokenize)
        chrf = sacrebleu.metrics.CHRF()
        bleu_score = bleu.corpus_score(predictions, streams)
        chrf_score = chrf.corpus_score(predictions, streams)
        return {
            "bleu": bleu_score.score,
            "chrf": chrf_score.score,
            "bleu_signature": str(bleu.get_signature()),
            "chrf_signature": str(chrf.get_signature()),
        }
