"""Penn Treebank trees as §6.3's parser's training pairs: a sentence and its tree linearized as tensor2tensor's
parsing problem writes it, the words left out (training/metrics/evalb reads it back); and back.

    python training/treebank.py wsj/02/*.mrg ... wsj/21/*.mrg > train.jsonl
    python training/treebank.py --bracket wsj23.en wsj23.tree > wsj23.parsed   # decoded trees, with their words

The first prints one JSON line per tree, {"translation": {"en": sentence, "tree": linearized tree}}, for
`training/run.py --source_lang en --target_lang tree --train_file train.jsonl`. As parsers are trained on the WSJ:
traces (-NONE-) and the constituents left empty without them are dropped, function tags and indices cut (NP-SBJ-1 is
NP), the root (TOP, or the treebank's unlabeled outer bracket) left out. The second puts each sentence's words into the
tree decoded for it (`vaswani-translate`'s lines), in the treebank's brackets under TOP, for EVALB or any reader of
trees: read as training/metrics/evalb reads it, and `(TOP)` where it tags another number of words (EVALB skips it).
"""

import argparse
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.metrics.evalb.evalb import constituent_labels, read
from vaswani_hf.tools.text import utf8_output

TOKENS = re.compile(r"\(|\)|[^\s()]+")


def trees(text: str) -> list:
    """The bracketed trees of `text`, each a (label, children) of nested lists, a word a plain string; unbalanced
    brackets are a ValueError naming the line."""
    stack, found, begun = [[None, []]], [], 0  # begun: where the tree being read starts

    def line(position: int) -> str:
        return f"line {text.count(chr(10), 0, position) + 1}"

    for match in TOKENS.finditer(text):
        token = match.group()
        if token == "(":
            begun = match.start() if len(stack) == 1 else begun
            stack.append(["", []])
        elif token == ")":
            if len(stack) == 1:
                raise ValueError(f"{line(match.start())}: a ')' closes nothing")
            node = stack.pop()
            (stack[-1][1] if len(stack) > 1 else found).append(node)
        elif stack[-1][0] == "" and not stack[-1][1] and len(stack) > 1:
            stack[-1][0] = token
        else:
            stack[-1][1].append(token)
    if len(stack) > 1:
        raise ValueError(f"{line(begun)}: the tree that starts there is never closed")
    return found


def cleaned(node):
    """The node without traces, function tags and empty constituents (None if nothing is left of it)."""
    label, children = node
    if label == "-NONE-":
        return None
    if all(isinstance(child, str) for child in children):  # a part-of-speech tag and its word
        return node
    kept = [child for child in map(cleaned, children) if child is not None]
    return [re.split("[-=]", label, maxsplit=1)[0] or label, kept] if kept else None


def linearized(tree) -> tuple[str, str]:
    """(sentence, linearized tree) of a tree whose root is left out."""
    words, labels = [], []

    def walk(node):
        label, children = node
        labels.append(label)
        if all(isinstance(child, str) for child in children):
            words.extend(children)
            return
        for child in children:
            walk(child)
        labels.append("/" + label)

    root = cleaned(tree)
    if root is None:
        return "", ""
    for node in (root[1] if root[0] in ("", "TOP", "ROOT") else [root]):
        walk(node)
    return " ".join(words), " ".join(labels)


def bracketed(sentence: str, tree: str, constituents: set[str]) -> str:
    """The linearized `tree` decoded for `sentence`, its words in it, in the treebank's brackets under TOP; `(TOP)`
    where it does not tag each word once (a trace, -NONE-, takes none)."""
    tags, spans = read(tree, constituents)
    words = sentence.split()
    if sum(tag != "-NONE-" for tag in tags) != len(words):
        return "(TOP)"
    words.reverse()
    # spans come innermost first (read() closes them so): of two with the same words, the later one is outside
    spans = sorted((first, -end, -order, label) for order, (label, first, end) in enumerate(spans) if end > first)
    text = []
    for index, tag in enumerate(tags):
        text += [f"({label}" for first, _, _, label in spans if first == index]
        closed = sum(-end == index + 1 for _, end, _, _ in spans)
        text.append(f"({tag} {'*' if tag == '-NONE-' else words.pop()})" + ")" * closed)
    return f"(TOP {' '.join(text)})"


def main(argv: list[str] | None = None) -> None:
    utf8_output()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path, help="Penn Treebank files (.mrg), trees in brackets")
    parser.add_argument("--bracket", nargs=2, type=Path, metavar=("SENTENCES", "TREES"),
                        help="Write the decoded TREES (a linearized tree a line) with the words of SENTENCES instead")
    args = parser.parse_args(argv)
    if args.bracket:
        return bracket_files(*args.bracket)
    if not args.files:
        parser.error("give treebank files, or --bracket SENTENCES TREES")
    pairs, empty = [], 0
    for path in args.files:
        try:
            found = trees(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise SystemExit(f"error: {path}: {error}") from None
        for tree in found:
            sentence, tree_text = linearized(tree)
            if sentence:
                pairs.append({"translation": {"en": sentence, "tree": tree_text}})
            empty += not sentence
    for pair in pairs:
        print(json.dumps(pair, ensure_ascii=False))
    files = f"{len(args.files)} file{'s' * (len(args.files) > 1)}"
    print(f"{len(pairs):,} trees from {files}" + f"; {empty} without words left out" * bool(empty), file=sys.stderr)


def bracket_files(sentences_file: Path, trees_file: Path) -> None:
    try:
        sentences, decoded = (path.read_text(encoding="utf-8").splitlines() for path in (sentences_file, trees_file))
    except (OSError, UnicodeDecodeError) as error:
        raise SystemExit(f"error: --bracket: {error}") from None
    if len(sentences) != len(decoded):
        raise SystemExit(f"error: --bracket: {sentences_file} has {len(sentences):,} lines, {trees_file} "
                         f"{len(decoded):,}: a decoded tree a sentence")
    constituents = constituent_labels(decoded)  # the labels any decoded tree closes
    for sentence, tree in zip(sentences, decoded):
        print(bracketed(sentence, tree, constituents))


if __name__ == "__main__":
    main()
