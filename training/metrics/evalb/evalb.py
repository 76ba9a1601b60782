"""A local `evaluate` metric: EVALB's labeled bracketing precision, recall and F1 with Collins' parameters
(COLLINS.prm), the score of §6.3's parser, for trees linearized as tensor2tensor's parsing problem writes them:
`evaluate.load("training/metrics/evalb")`.

A linearized tree is its labels in order, words left out: (S (NP (DT The) (NN dog)) (VP (VBZ barks)) (. .)) is
`S NP DT NN /NP VP VBZ /VP . /S`. A label opens a node and `/X` closes the innermost open X; a label that the
references or the tree itself close is a constituent, any other a part-of-speech tag (one word). A decoded tree need
not be well formed: a close with no open X is dropped, one that skips open constituents closes them too, and those
still open close at the end.

Scored as EVALB scores: the words tagged -NONE- (traces) or punctuation (, : `` '' .) are deleted, and with them the
constituents that dominate nothing else; TOP is not counted; function tags are cut (NP-SBJ is NP); ADVP and PRT are
one label. A constituent is correct where the reference has one of the same label and words, each matched once.
A sentence whose output tags another number of words than its reference (traces not counted: there is no sentence
to put in its brackets), or keeps another number or none once punctuation is deleted (EVALB's "length unmatch"), is
skipped, as EVALB skips it, and counted in `skipped`: the scores are over the other sentences. So that skipping never
scores, `bracket_f1_all` is the F1 with the skipped sentences' constituents counted as missed.
"""

import itertools
import re
from collections import Counter

import datasets
import evaluate

DELETED_TAGS = {"-NONE-", ",", ":", "``", "''", "."}
EQUAL_LABELS = {"PRT": "ADVP"}


def constituent_labels(references: list[str]) -> set[str]:
    return {token[1:] for reference in references for token in reference.split() if token.startswith("/")}


def read(linearized: str, constituents: set[str]) -> tuple[list[str], list[tuple[str, int, int]]]:
    """The tree's tags, word by word, and its constituents as (label, first word, end word)."""
    tags, spans, open_ = [], [], []  # open_: (label, first word) of each open constituent, innermost last
    for token in linearized.split():
        if token.startswith("/"):
            labels = [label for label, _ in open_]
            if token[1:] in labels:
                innermost = len(labels) - 1 - labels[::-1].index(token[1:])
                while len(open_) > innermost:
                    label, first = open_.pop()
                    spans.append((label, first, len(tags)))
        elif token in constituents:
            open_.append((token, len(tags)))
        else:
            tags.append(token)
    spans += [(label, first, len(tags)) for label, first in reversed(open_)]
    return tags, spans


def brackets(linearized: str, constituents: set[str]) -> tuple[tuple[int, int], Counter]:
    """EVALB's view of a tree: its number of words, before and after the deletions, and its brackets, (label, start,
    end) counted."""
    tags, spans = read(linearized, constituents)
    position = list(itertools.accumulate((tag not in DELETED_TAGS for tag in tags), initial=0))
    counted = Counter()
    for label, first, end in spans:
        label = re.split("[-=]", label, maxsplit=1)[0]
        if position[end] > position[first] and label != "TOP":
            counted[EQUAL_LABELS.get(label, label), position[first], position[end]] += 1
    return (sum(tag != "-NONE-" for tag in tags), position[-1]), counted


def f1(precision: float, recall: float) -> float:
    return 2 * precision * recall / max(precision + recall, 1e-9)


class Evalb(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description="EVALB's labeled bracketing scores (COLLINS.prm) of linearized constituency trees.",
            citation="Sekine and Collins, 1997. EVALB; Collins, 1997. Three Generative, Lexicalised Models for "
                     "Statistical Parsing.",
            inputs_description="predictions and references: lists of linearized trees, one per sentence.",
            features=datasets.Features({"predictions": datasets.Value("string"),
                                        "references": datasets.Value("string")}),
        )

    def _compute(self, predictions, references):
        constituents = constituent_labels(references)
        matched = gold = test = complete = skipped = missed = 0
        for prediction, reference in zip(predictions, references):
            length, expected = brackets(reference, constituents)
            found_length, found = brackets(prediction, constituents | constituent_labels([prediction]))
            if found_length != length or found_length[1] == 0:
                skipped, missed = skipped + 1, missed + expected.total()
                continue
            matched, gold, test = matched + (expected & found).total(), gold + expected.total(), test + found.total()
            complete += expected == found
        scored = len(predictions) - skipped
        precision, recall = 100 * matched / max(test, 1), 100 * matched / max(gold, 1)
        return {
            "bracket_f1": f1(precision, recall),
            "bracket_precision": precision,
            "bracket_recall": recall,
            "bracket_f1_all": f1(precision, 100 * matched / max(gold + missed, 1)),
            "complete_match": 100 * complete / max(scored, 1),
            "skipped": skipped,
            "bracket_f1_signature": f"EVALB COLLINS.prm|sentences:{scored}|skipped:{skipped}",
        }
