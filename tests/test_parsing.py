"""§6.3's parser: Penn Treebank trees as training pairs (training/treebank.py) and EVALB's bracketing scores of the
linearized trees (training/metrics/evalb), against EVALB itself."""

import json
from types import SimpleNamespace

import numpy as np
import pytest
from support import refusal, run_training, tiny_model
from transformers import AutoTokenizer, EvalPrediction

from training import evaluation, run_trainer, treebank
from training.batching import encode
from training.evaluation import score
from training.metrics.evalb.evalb import brackets, constituent_labels, read
from training.run_trainer import make_compute_metrics
from training.tokenizer import train_joint_bpe

# Reference trees and a parser's, in the treebank's brackets: function tags, a trace with the constituent that holds
# nothing else, punctuation at the edges and inside, PRT against ADVP, unary NPs over NPs (5: the parser's alone; 9:
# both), an extra constituent, and one output whose last word is tagged as punctuation (8: EVALB cannot score it).
GOLD = """
(TOP (S (NP-SBJ (DT The) (NN dog)) (VP (VBD chased) (NP (DT the) (NN cat))) (. .)))
(TOP (S (`` ``) (NP-SBJ-1 (PRP It)) (VP (VBD was) (VP (VBN given) (NP (-NONE- *-1)) (PRT (RP up)))) (. .) ('' '')))
(TOP (S (NP-SBJ (NP (DT The) (NN book)) (PP (IN on) (NP (DT the) (NN table)))) (, ,) (ADVP (RB however)) (, ,)
  (VP (VBZ is) (ADJP-PRD (JJ old))) (. .)))
(TOP (SBARQ (WHNP-1 (WP What)) (SQ (VBD did) (NP-SBJ (PRP she)) (VP (VB see) (NP (-NONE- *T*-1)))) (. ?)))
(TOP (S (NP-SBJ (NP (NNS Prices)) (: --) (NP (JJ most) (NNS prices)) (: --)) (VP (VBD rose) (ADVP-TMP (RB sharply)))
  (. .)))
(TOP (S (NP-SBJ (PRP We)) (VP (VBD looked) (PRT (RP up)) (NP (DT the) (NN word))) (. .)))
(TOP (NP (NP (DT A) (NN list)) (PP (IN of) (NP (NNS names))) (. .)))
(TOP (S (NP-SBJ (PRP He)) (VP (VBD left)) (. .)))
(TOP (S (NP-SBJ (NP (NNP John))) (VP (VBZ sleeps)) (. .)))
"""
PARSED = """
(TOP (S (NP (DT The) (NN dog)) (VP (VBD chased) (NP (DT the) (NN cat))) (. .)))
(TOP (S (`` ``) (NP (PRP It)) (VP (VBD was) (VP (VBN given) (ADVP (RP up)))) (. .) ('' '')))
(TOP (S (NP (DT The) (NN book)) (PP (IN on) (NP (DT the) (NN table))) (, ,) (ADVP (RB however)) (, ,) (VP (VBZ is)
  (ADJP (JJ old))) (. .)))
(TOP (SBARQ (WHNP (WP What)) (SQ (VBD did) (NP (PRP she)) (VP (VB see))) (. ?)))
(TOP (S (NP (NP (NNS Prices)) (: --) (NP (NP (JJ most) (NNS prices))) (: --)) (VP (VBD rose) (ADVP (RB sharply)))
  (. .)))
(TOP (S (NP (PRP We)) (VP (VBD looked) (NP (PRT (RP up)) (DT the) (NN word))) (. .)))
(TOP (NP (NP (ADJP (DT A)) (NN list)) (PP (IN of) (NP (NNS names))) (. .)))
(TOP (S (NP (PRP He)) (VP (. left)) (. .)))
(TOP (S (NP (NP (NNP John))) (VP (VBZ sleeps)) (. .)))
"""
# EVALB (the 2006 release, nikitakit/self-attentive-parser's copy, built with gcc) on these two files as they are,
# `evalb -p COLLINS.prm gold parsed`: 39 brackets matched of 41 and 42, 4 of the 8 sentences scored complete,
# sentence 8 an error ("Length unmatch (2|1)").
EVALB = {"bracket_recall": 95.12, "bracket_precision": 92.86, "bracket_f1": 93.98, "complete_match": 50.0,
         "skipped": 1}


def linearized_trees(text: str) -> list[str]:
    return [treebank.linearized(tree)[1] for tree in treebank.trees(text)]


def test_bracketing_scores_are_evalbs_with_collins_parameters():
    scores = score(linearized_trees(PARSED), linearized_trees(GOLD), trees=True)
    assert {key: round(scores[key], 2) for key in EVALB} == EVALB
    assert scores["bracket_f1_signature"] == "EVALB COLLINS.prm|sentences:8|skipped:1"
    assert scores["bracket_f1_all"] == pytest.approx(100 * 2 * 39 / (42 + 41 + 3))  # sentence 8's S, NP and VP missed


def test_a_treebank_tree_becomes_its_sentence_and_tensor2tensors_linearization(tmp_path, capsys):
    """Traces and the constituents they alone fill are dropped, function tags and gapping indices cut, the root left
    out, whichever way the file writes it; a file holds several trees, over several lines; a tree of traces alone is
    no pair, and counted."""
    tree = "(S (NP-SBJ-1 (DT The) (NN dog)) (VP=2 (VBZ barks) (S (NP-SBJ (-NONE- *-1)))) (. .))"
    expected = ("The dog barks .", "S NP DT NN /NP VP VBZ /VP . /S")
    for written in (tree, f"(TOP {tree})", f"( {tree} )", f"(ROOT {tree})"):
        assert [treebank.linearized(found) for found in treebank.trees(written)] == [expected]
    (tmp_path / "wsj_0001.mrg").write_text(f"( {tree.replace(' (VP', chr(10) + '    (VP')} )\n\n(TOP {tree})\n",
                                                             encoding="utf-8")
    (tmp_path / "wsj_0002.mrg").write_text("( (S (NP-SBJ (-NONE- *)) (VP (-NONE- *?*))) )\n", encoding="utf-8")
    treebank.main([str(tmp_path / "wsj_0001.mrg")])
    printed = capsys.readouterr()
    rows = [json.loads(line)["translation"] for line in printed.out.splitlines()]
    assert rows == [{"en": expected[0], "tree": expected[1]}] * 2 and printed.err == "2 trees from 1 file\n"
    treebank.main([str(tmp_path / "wsj_0001.mrg"), str(tmp_path / "wsj_0002.mrg")])
    assert capsys.readouterr().err == "2 trees from 2 files; 1 without words left out\n"


def test_decoded_trees_take_their_sentences_words_in_the_treebanks_brackets(tmp_path, capsys):
    """--bracket: each parsed tree of the fixture, linearized, comes back as the tree it was (cleaned, under TOP),
    the gold sentence's words in it (the C program, given such files in development, gave EVALB's figures above).
    A tree of another number of words is `(TOP)`, which EVALB skips; files of unequal lengths are one line."""
    gold = [treebank.linearized(tree) for tree in treebank.trees(GOLD)]
    parsed = linearized_trees(PARSED)
    (tmp_path / "s.en").write_text("".join(sentence + "\n" for sentence, _ in gold), encoding="utf-8")
    (tmp_path / "t.tree").write_text("".join(tree + "\n" for tree in parsed + ["S NP DT NN /NP /S"]), encoding="utf-8")
    assert refusal(capsys, treebank.main, "--bracket", tmp_path / "s.en", tmp_path / "t.tree") == (
        f"error: --bracket: {tmp_path / 's.en'} has 9 lines, {tmp_path / 't.tree'} 10: a decoded tree a sentence")
    (tmp_path / "t.tree").write_text("".join(tree + "\n" for tree in parsed), encoding="utf-8")
    treebank.main(["--bracket", str(tmp_path / "s.en"), str(tmp_path / "t.tree")])
    written = capsys.readouterr().out.splitlines()
    assert [treebank.trees(line) for line in written] == [[treebank.cleaned(tree)] for tree in treebank.trees(PARSED)]
    assert written[7] == "(TOP (S (NP (PRP He)) (VP (. left)) (. .)))"  # sentence 8: the same 3 words
    assert treebank.bracketed("Up", "S ADVP RB /ADVP /S", {"S", "ADVP"}) == "(TOP (S (ADVP (RB Up))))"  # a unary
    assert treebank.bracketed("He left .", "S NP PRP /NP VP VBD /VP /S", constituent_labels(parsed)) == "(TOP)"
    # a trace takes no word; a constituent closed over no word is left out
    assert treebank.bracketed("Dogs bark", "S NP NNS /NP VP VBP -NONE- /VP /S", {"S", "NP", "VP"}) == (
        "(TOP (S (NP (NNS Dogs)) (VP (VBP bark) (-NONE- *))))")
    assert treebank.bracketed("Dogs bark", "S NP NNS /NP VP /VP VP VBP /VP /S", {"S", "NP", "VP"}) == (
        "(TOP (S (NP (NNS Dogs)) (VP (VBP bark))))")


@pytest.mark.parametrize(("text", "said"), [
    ("(S (NP (DT A) (NN dog)))\n\n(S (NP (DT The)\n  (NN dog))", "line 3: the tree that starts there is never closed"),
    ("(S (NP (DT A) (NN dog)))\n(S (NP (DT The) (NN dog))))", "line 2: a ')' closes nothing"),
])
def test_unbalanced_brackets_are_one_line_naming_the_file_and_line(tmp_path, capfd, text, said):
    (tmp_path / "bad.mrg").write_text(text, encoding="utf-8")
    assert refusal(capfd, treebank.main, str(tmp_path / "bad.mrg")) == f"error: {tmp_path / 'bad.mrg'}: {said}"


def spans(tree, first: int = 0) -> tuple[int, list]:
    """The words of a tree from treebank.trees and its constituents' (label, first word, end word), the tree's own
    first."""
    label, children = tree
    if all(isinstance(child, str) for child in children):
        return 1, []
    found, end = [], first
    for child in children:
        words, inner = spans(child, end)
        found, end = found + inner, end + words
    return end - first, [(label, first, end), *found]


def test_a_linearized_tree_reads_back_as_the_treebanks_constituents():
    """Nested constituents of one label (NP in NP, VP in VP) close where the bracketed tree closes them."""
    for tree in treebank.trees(GOLD):
        root = treebank.cleaned(tree)[1][0]
        text = treebank.linearized(tree)[1]
        assert sorted(read(text, constituent_labels([text]))[1]) == sorted(spans(root)[1])


def test_tensor2tensors_own_trees_score_as_cleaned_ones():
    """A linearization that keeps traces, function tags and the root (tensor2tensor's, of raw treebank files) is read
    with EVALB's deletions: the same brackets as the cleaned one."""
    raw = "TOP S `` NP-SBJ-1 PRP /NP-SBJ-1 VP VBD VP VBN NP -NONE- /NP PRT RP /PRT /VP /VP . '' /S /TOP"
    clean = "S `` NP PRP /NP VP VBD VP VBN PRT RP /PRT /VP /VP . '' /S"
    assert brackets(raw, constituent_labels([raw])) == brackets(clean, constituent_labels([clean]))
    assert brackets(clean, constituent_labels([clean]))[1] == {("S", 0, 4): 1, ("NP", 0, 1): 1, ("VP", 1, 4): 1,
                                                              ("VP", 2, 4): 1, ("ADVP", 3, 4): 1}


def test_a_tree_without_a_words_tag_is_skipped_though_its_scored_words_match():
    """The final `.` left out: the scored words (punctuation deleted) are as many, but the sentence's words are not,
    so no bracketed tree holds them: skipped."""
    assert score(["S NP DT NN /NP VP VBZ /VP /S"], ["S NP DT NN /NP VP VBZ /VP . /S"], trees=True)["skipped"] == 1


@pytest.mark.parametrize("decoded", [
    "S NP DT NN /NP VP VBZ",  # closes missing at the end
    "S NP DT NN /NP /PP VP VBZ /VP /S",  # a close with nothing of its label open
    "S NP DT NN /NP VP VBZ /S",  # a close over an open constituent
])
def test_a_decoded_tree_that_is_not_well_formed_is_read_as_the_nearest_one_that_is(decoded):
    constituents = constituent_labels(["S NP DT NN /NP VP VBZ /VP /S"])
    assert brackets(decoded, constituents) == brackets("S NP DT NN /NP VP VBZ /VP /S", constituents)


@pytest.mark.parametrize("script", ["run.py", "run_trainer.py"])
def test_evalb_on_targets_that_are_not_trees_is_refused_before_the_tokenizer(tmp_path, script):
    """--evalb with the embedded EN-DE data: one line, before the joint BPE is learned."""
    flags = ["--evalb", "--output_dir", str(tmp_path / "run"), "--max_steps", "1", "--vocab_size", "300",
             "--d_model", "32", "--d_ff", "64", "--num_heads", "4", "--num_layers", "2"]
    with pytest.raises(SystemExit) as stop:
        run_training(*flags) if script == "run.py" else run_trainer.main(flags)
    assert stop.value.code == ("error: --evalb: the validation targets are not linearized trees (none closes a "
                               "constituent with /X): make them with training/treebank.py")
    assert not (tmp_path / "run" / "tokenizer.json").exists()


def test_evalb_takes_splits_whose_first_targets_close_a_constituent_and_checks_the_test_split_too():
    """check_trees looks at the first 100 targets of each split: a tree of one tag (no /X) first is still trees."""
    from datasets import Dataset

    def split(*targets):
        return Dataset.from_dict({"source": ["w"] * len(targets), "target": list(targets)})

    trees = split("NN", "S NP NN /NP /S")
    evaluation.check_trees({"validation": trees, "test": trees}, evalb=True)
    evaluation.check_trees({"validation": split("Ein Hund.")}, evalb=False)
    with pytest.raises(SystemExit, match="^error: --evalb: the test targets are not linearized trees"):
        evaluation.check_trees({"validation": trees, "test": split("Ein Hund.", "Eine Katze.")}, evalb=True)


def test_a_parsers_scores_as_the_run_prints_them():
    """EVALB's F1 of the scored sentences, the skipped count and the F1 with the skipped ones' constituents missed."""
    scores = {"bracket_f1": 93.98, "skipped": 1, "bracket_f1_all": 90.7, "bleu": 80.0, "chrf": 85.0}
    assert evaluation.reported(scores) == ("EVALB F1 94.0 (1 skipped; 90.7 with their constituents missed)  "
                                           "sacreBLEU 80.0  chrF 85.0")


def test_a_constituent_that_no_reference_has_is_read_as_one():
    """A label the output closes is a constituent even where no reference has it (a rare one, FRAG here): a wrong
    bracket, not a word, which would have EVALB skip the sentence."""
    scores = score(["S FRAG DT NN /FRAG VP VBZ /VP /S"], ["S NP DT NN /NP VP VBZ /VP /S"], trees=True)
    assert scores["skipped"] == 0 and scores["bracket_precision"] == scores["bracket_recall"] == pytest.approx(200 / 3)


def test_a_parsers_alpha_is_chosen_by_f1_with_the_skipped_sentences_missed(translation_folder, monkeypatch):
    """Trees decoded (a stand-in) with α 0.3: half with a word too many, which EVALB skips, the rest right (its F1
    100); with α 0.6: each scored, one NP of four missed (F1 600/7). 0.6 wins: skipped, 0.3's half scores nothing
    (recall 8 of 16, F1 200/3)."""
    tokenizer = AutoTokenizer.from_pretrained(translation_folder)
    gold = "S NP DT NN /NP VP VBZ NP DT NN /NP /VP . /S"
    decoded = {0.3: ["S NP DT NN /NP VP VBZ NP DT NN NN /NP /VP . /S", gold] * 2,
               0.6: ["S NP DT NN /NP VP VBZ DT NN /VP . /S"] * 4}
    monkeypatch.setattr(evaluation, "translate", lambda model, tokenizer, sources, num_beams, alpha: decoded[alpha])
    pairs = {"validation": [(f"The dog sees cat {i}.", gold) for i in range(4)]}
    args = SimpleNamespace(alpha_candidates=[0.3, 0.6], length_penalty_alpha=0.3, num_beams=4, max_tokens=400,
                           evalb=True)
    said = []
    metrics, alpha = evaluation.final_evaluation(tiny_model(vocab_size=len(tokenizer)), tokenizer, pairs,
                                                 encode(tokenizer, pairs["validation"]), args, said.append, "tree")
    assert said[0] == "GNMT α by validation F1, skipped sentences missed: 0.3: 66.67, 0.6: 85.71 -> 0.6"
    assert said[1].startswith("validation: EVALB F1 85.7 (0 skipped; 85.7 with their constituents missed)  sacreBLEU")
    assert score(decoded[0.3], [gold] * 4, trees=True)["bracket_f1"] == 100
    assert alpha == 0.6 and metrics["alpha_search"] == {0.3: pytest.approx(200 / 3), 0.6: pytest.approx(600 / 7)}
    assert metrics["validation"]["bracket_f1"] == pytest.approx(600 / 7)
    assert "bleu_tokenized" not in metrics["validation"]  # Table 2's BLEU is of sentences, not trees


def test_the_trainers_metrics_score_trees_as_run_py_does():
    """run_trainer.py's compute_metrics with --evalb, on the Trainer's -100-padded ids of decoded and reference trees:
    the scores `score` gives the texts (sentence 8 skipped)."""
    references, decoded = linearized_trees(GOLD), linearized_trees(PARSED)
    tokenizer = train_joint_bpe(references + decoded, 200)

    def padded(texts):
        ids = tokenizer(texts)["input_ids"]
        return np.array([row + [-100] * (max(map(len, ids)) - len(row)) for row in ids])

    metrics = make_compute_metrics(tokenizer, True)(EvalPrediction(predictions=padded(decoded),
                                                                   label_ids=padded(references)))
    expected = score(decoded, references, trees=True)
    assert metrics == {key: expected[key] for key in ("bleu", "chrf", "bracket_f1", "bracket_f1_all", "skipped")}
    assert metrics["skipped"] == 1
