"""Penn Treebank trees as §6.3's parser's training pairs: a sentence and its tree linearized as tensor2tensor's
parsing problem writes it, the words left out (training/metrics/evalb reads it back).

    python training/treebank.py wsj/02/*.mrg ... wsj/21/*.mrg > train.jsonl

prints one JSON line per tree, {"translation": {"en": sentence, "tree": linearized tree}}, for `training/run.py
--source_lang en --target_lang tree --train_file train.jsonl`. As parsers are trained on the WSJ: traces (-NONE-) and
the constituents left empty without them are dropped, function tags and indices cut (NP-SBJ-1 is NP), the root (TOP,
or the treebank's unlabeled outer bracket) left out.
"""

import argparse
import json
import re
import sys
from pathlib import Path

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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="+", type=Path, help="Penn Treebank files (.mrg), trees in brackets")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    main()
