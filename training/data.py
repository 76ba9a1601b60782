"""Parallel text in, sentence pairs out: a Hub dataset with a `translation` column, JSON lines files
(`{"translation": {"en": "...", "de": "..."}}`), plain aligned text files (`PREFIX.en` / `PREFIX.de`, one
sentence per line), or — with none of those — the embedded default dataset of `training/data/default/`.
"""

from pathlib import Path

import datasets

from vaswani_hf.text import read_lines

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "default"
SPLITS = ("train", "validation", "test")


def load_pairs(source_lang: str, target_lang: str, dataset_name: str | None = None,
               dataset_config_name: str | None = None, files: dict[str, str | None] | None = None,
               ) -> dict[str, list[tuple[str, str]]]:
    """{split: [(source, target), ...]} for the splits that exist."""
    files = {split: path for split, path in (files or {}).items() if path}
    if dataset_name:
        raw = datasets.load_dataset(dataset_name, dataset_config_name)
        raw = {("validation" if split == "valid" else split): raw[split] for split in raw}
        return {split: _pairs(rows, source_lang, target_lang) for split, rows in raw.items() if split in SPLITS}
    if not files:
        files = {split: str(DEFAULT_DATA / f"{split}.jsonl") for split in SPLITS}
    pairs = {}
    for split, path in files.items():
        if path.endswith((".json", ".jsonl")):
            if not Path(path).is_file():
                raise FileNotFoundError(f"--{split}_file {path}: no such file")
            rows = datasets.load_dataset("json", data_files=path, split="train")
            pairs[split] = _pairs(rows, source_lang, target_lang)
        else:
            pairs[split] = _aligned_text(path, source_lang, target_lang, split)
    return pairs


def _pairs(rows, source_lang: str, target_lang: str) -> list[tuple[str, str]]:
    if "translation" in rows.column_names:
        first = rows[0]["translation"]
        if source_lang not in first or target_lang not in first:
            raise ValueError(f"the translation column has languages {sorted(first)}, not {source_lang} and {target_lang}")
        return [(row[source_lang], row[target_lang]) for row in rows["translation"]]
    if source_lang in rows.column_names and target_lang in rows.column_names:  # e.g. bentrevett/multi30k
        return list(zip(rows[source_lang], rows[target_lang]))
    raise ValueError(f"no 'translation' column and no '{source_lang}'/'{target_lang}' columns in {rows.column_names}")


def _aligned_text(prefix: str, source_lang: str, target_lang: str, split: str) -> list[tuple[str, str]]:
    sides = []
    for lang in (source_lang, target_lang):
        path = Path(f"{prefix}.{lang}")
        if not path.is_file():
            raise FileNotFoundError(f"--{split}_file {prefix}: expected JSON lines or aligned {path}, not found")
        sides.append(read_lines(path))
    if len(sides[0]) != len(sides[1]):
        raise ValueError(f"--{split}_file {prefix}: {len(sides[0])} {source_lang} lines but {len(sides[1])} {target_lang} lines")
    return list(zip(*sides))


def load_run_pairs(data_args) -> dict[str, list[tuple[str, str]]]:
    """The pairs of a training run's data flags (training/arguments.py DataArguments); a missing, misaligned or
    unreadable file, or no training split, is a one-line SystemExit."""
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    try:
        pairs = load_pairs(data_args.source_lang, data_args.target_lang, data_args.dataset_name,
                           data_args.dataset_config_name, files)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    if "train" not in pairs:
        raise SystemExit("error: no training data: give --dataset_name or --train_file (or neither, for the embedded data)")
    return pairs
