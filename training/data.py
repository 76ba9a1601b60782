"""Parallel text in, `datasets` out: a Hub dataset with a `translation` column (or one column per language), JSON
lines files (`{"translation": {"en": "...", "de": "..."}}`), plain aligned text files (`PREFIX.en` / `PREFIX.de`,
one sentence per line), either .gz, .bz2 or .xz compressed too, or — with none of those — the embedded default dataset
of `training/data/default/`.

Every source becomes, per split, a `datasets.Dataset` of `source` and `target` strings, written once as Arrow into
datasets' cache and memory-mapped from there: no process holds the corpus in its own memory. With `streaming`, a
`datasets.IterableDataset` instead, read as it is iterated and never stored (training/streaming.py).
"""

import itertools
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path

import datasets
import pyarrow as pa
from datasets.builder import Key

from training.tokens import RECORD_BATCH
from vaswani_hf.tools.text import DECOMPRESSED, decode_utf8, opened, split_lines

DEFAULT_DATA = Path(__file__).resolve().parent / "data" / "default"
SPLITS = ("train", "validation", "test")
PAIR_FEATURES = datasets.Features({"source": datasets.Value("string"), "target": datasets.Value("string")})


# JSON lines, as they are or compressed: datasets' JSON reader decompresses by the suffix, as `opened` does.
JSON_LINES = re.compile(r"\.jsonl?(\.(gz|bz2|xz))?$")


class DataError(ValueError):
    """A data file that cannot be read as pairs (misaligned, not UTF-8): in a stream, found only where it is read."""


def load_splits(source_lang: str, target_lang: str, dataset_name: str | None = None,
                dataset_config_name: str | None = None, files: dict[str, str | None] | None = None,
                streaming: bool = False) -> dict[str, datasets.Dataset | datasets.IterableDataset]:
    """{split: Dataset (IterableDataset with `streaming`) of `source` and `target`} for the splits that exist; a
    missing, misaligned, unreadable or empty file (or Hub split), or languages the data lacks, is a one-line OSError
    or ValueError (in a stream, a misaligned or unreadable line only when it is reached)."""
    files = {split: path for split, path in (files or {}).items() if path}
    if dataset_name:
        try:
            raw = datasets.load_dataset(dataset_name, dataset_config_name, streaming=streaming)
        except ValueError as error:  # datasets' words for an empty split: 'Instruction "test" corresponds to no data!'
            empty = re.match(r'Instruction "(\w+)" corresponds to no data', str(error))
            if empty is None:
                raise
            raise ValueError(f"the {empty[1]} split has no pairs ({dataset_name})") from None
        raw = {("validation" if split == "valid" else split): raw[split] for split in raw}
        return {split: _columns(rows, source_lang, target_lang, f"{dataset_name} ({split})")
                for split, rows in raw.items() if split in SPLITS}
    if not files:
        files = {split: str(DEFAULT_DATA / f"{split}.jsonl") for split in SPLITS}
    for split, path in files.items():  # every file found before any is read
        if not JSON_LINES.search(path):
            _aligned_paths(path, source_lang, target_lang, split)
        elif not Path(path).is_file():
            raise FileNotFoundError(f"--{split}_file {path}: no such file")
    splits = {}
    # The small splits first: a mistake in one of them shows before the training pairs' minutes of reading.
    for split, path in sorted(files.items(), key=lambda item: item[0] == "train"):
        if JSON_LINES.search(path):
            with opened(path) as file:
                if not any(line.strip() for line in file):  # (datasets would say "train" has no data)
                    raise ValueError(f"the {split} split has no pairs ({path})")
            splits[split] = _columns(_json_lines(path, split, streaming), source_lang, target_lang,
                                     f"--{split}_file {path}")
        else:
            splits[split] = _aligned_text(path, source_lang, target_lang, split, streaming)
    return {split: splits[split] for split in files}


def load_pairs(*args, **kwargs) -> dict[str, list[tuple[str, str]]]:
    """`load_splits` as lists of (source, target) pairs, for the small splits and small corpora."""
    return {split: as_pairs(rows) for split, rows in load_splits(*args, **kwargs).items()}


def as_pairs(rows: datasets.Dataset | datasets.IterableDataset) -> list[tuple[str, str]]:
    if isinstance(rows, datasets.IterableDataset):
        return [(row["source"], row["target"]) for row in rows]
    return list(zip(rows["source"], rows["target"]))


def _json_lines(path: str, split: str, streaming: bool):
    # datasets logs a line of its own before a parse error (in a stream, when it is read): the DataError says more
    logging.getLogger("datasets.packaged_modules.json.json").setLevel(logging.CRITICAL)
    try:
        return datasets.load_dataset("json", data_files=path, split="train", streaming=streaming)
    except datasets.exceptions.DatasetGenerationError as error:
        raise DataError(f"--{split}_file {path}: {_bad_json_line(path) or error.__cause__ or error}") from None


def _bad_json_line(path: str) -> str | None:
    """Where a JSON lines file first fails to parse ("line N is not JSON: why"), which pyarrow's error does not say
    (its "row" counts objects from 0, blank lines not counted); None where every line parses."""
    with opened(path) as file:
        for number, line in enumerate(file, 1):
            try:
                if line.strip():
                    json.loads(line)
            except ValueError as error:
                return f"line {number} is not JSON: {error}"
    return None


def _pair_columns(batch: dict, indices: list[int], source_lang: str, target_lang: str, label: str) -> dict:
    """`source` and `target` of a batch of rows, a pair's text each: anything else is a DataError naming the row."""
    columns = {}
    for name, lang in (("source", source_lang), ("target", target_lang)):
        texts = [(pair or {}).get(lang) for pair in batch["translation"]] if "translation" in batch else batch[lang]
        for index, text in zip(indices, texts):
            if not isinstance(text, str):
                raise DataError(f"{label}: pair {index + 1} has no {lang} text (it holds {text!r})")
        columns[name] = texts
    return columns


def _columns(rows, source_lang: str, target_lang: str, label: str):
    try:
        first = next(iter(rows.take(1)), None)  # a stream of JSON or CSV knows its columns once a row is read
    except pa.ArrowInvalid as error:  # a stream of JSON lines: its first block does not parse
        raise DataError(f"{label}: {error}") from None
    columns = rows.column_names or []
    if "translation" in columns:
        languages = (rows.features or {}).get("translation")
        languages = getattr(languages, "languages", None) or (sorted(first["translation"]) if first else [])
        if first and (source_lang not in languages or target_lang not in languages):
            raise ValueError(f"the translation column has languages {sorted(languages)}, not {source_lang} and "
                             f"{target_lang}")
    elif source_lang not in columns or target_lang not in columns:  # e.g. bentrevett/multi30k has en and de
        raise ValueError(f"no 'translation' column and no '{source_lang}'/'{target_lang}' columns in {columns}")
    return rows.map(_pair_columns, batched=True, with_indices=True, remove_columns=columns,
                    fn_kwargs={"source_lang": source_lang, "target_lang": target_lang, "label": label})


def _aligned_tables(paths: tuple[str, str], names: tuple[str, str], prefix: str, split: str):
    """The pairs of two aligned files as Arrow tables of `RECORD_BATCH` lines, split at "\\n" only, as `wc -l`
    counts: a misaligned or non-UTF-8 line is a one-line DataError, raised where it is read."""
    with opened(paths[0]) as source, opened(paths[1]) as target:
        read = 0
        while True:
            chunks = [list(itertools.islice(file, RECORD_BATCH)) for file in (source, target)]
            if len(chunks[0]) != len(chunks[1]):
                counts = [read + len(chunk) + sum(1 for _ in file) for chunk, file in zip(chunks, (source, target))]
                raise DataError(f"--{split}_file {prefix}: {counts[0]} {names[0]} lines but {counts[1]} {names[1]} "
                                f"lines")
            if not chunks[0]:
                return
            try:
                columns = [split_lines(decode_utf8(b"".join(chunk), path, read + 1))
                           for chunk, path in zip(chunks, paths)]
            except ValueError as error:
                raise DataError(str(error)) from None
            read += len(chunks[0])
            yield pa.table({"source": columns[0], "target": columns[1]})


@dataclass
class AlignedTextConfig(datasets.BuilderConfig):
    paths: tuple[str, str] = ("", "")
    names: tuple[str, str] = ("", "")
    prefix: str = ""
    split_name: str = "train"
    stamp: tuple = ()  # the files' sizes and modification times: part of the cache's name, so a changed file is read


class AlignedText(datasets.ArrowBasedBuilder):
    """datasets' builder for two aligned text files, a table of lines at a time (`Dataset.from_generator` would
    encode each pair as a Python example, at an eighth of the speed)."""

    BUILDER_CONFIG_CLASS = AlignedTextConfig

    def _info(self):
        return datasets.DatasetInfo(features=PAIR_FEATURES)

    def _split_generators(self, dl_manager):
        return [datasets.SplitGenerator(name=datasets.Split.TRAIN)]

    def _generate_tables(self):
        config = self.config
        for number, table in enumerate(_aligned_tables(config.paths, config.names, config.prefix, config.split_name)):
            yield Key(0, number), table


def _aligned_paths(prefix: str, source_lang: str, target_lang: str, split: str) -> list[str]:
    """PREFIX.<source_lang> and PREFIX.<target_lang>, as they are or compressed; else a one-line FileNotFoundError."""
    paths = []
    for lang in (source_lang, target_lang):
        candidates = [Path(f"{prefix}.{lang}{suffix}") for suffix in ("", *DECOMPRESSED)]
        path = next((candidate for candidate in candidates if candidate.is_file()), None)
        if path is None:
            instead = _instead(prefix, source_lang, target_lang)
            raise FileNotFoundError(f"--{split}_file {prefix}: expected JSON lines or aligned {prefix}.{lang} (or "
                                    f"{prefix}.{lang}.gz, .bz2, .xz), not found{instead}")
        paths.append(str(path))
    return paths


def _instead(path: str, source_lang: str, target_lang: str) -> str:
    """What a data flag takes, said to a file or folder given in its place: one side's file, a table of another
    kind, a folder of files."""
    if Path(path).is_dir():
        return ": a folder that datasets reads is given as --dataset_name"
    if not Path(path).is_file():
        return ""
    plain = path.removesuffix(Path(path).suffix) if Path(path).suffix in DECOMPRESSED else path
    side = next((lang for lang in (source_lang, target_lang) if plain.endswith(f".{lang}")), None)
    if side:
        return f": give the prefix {plain.removesuffix(f'.{side}')}, of both sides' files"
    return ": a CSV or TSV file whose first line names the languages goes in a folder given as --dataset_name"


def _aligned_text(prefix: str, source_lang: str, target_lang: str, split: str, streaming: bool = False):
    paths = _aligned_paths(prefix, source_lang, target_lang, split)
    stamp = tuple((Path(path).stat().st_size, Path(path).stat().st_mtime_ns) for path in paths)
    if not any(size for size, _ in stamp):
        raise ValueError(f"the {split} split has no pairs ({prefix})")
    builder = AlignedText(dataset_name="aligned_text", paths=tuple(paths), names=(source_lang, target_lang),
                          prefix=prefix, split_name=split, stamp=stamp, writer_batch_size=RECORD_BATCH)
    if streaming:
        return builder.as_streaming_dataset(split=datasets.Split.TRAIN)
    try:
        builder.download_and_prepare()
    except datasets.exceptions.DatasetGenerationError as error:
        cause = error.__cause__ or error.__context__
        raise cause if isinstance(cause, ValueError) else error from None
    return builder.as_dataset(split=datasets.Split.TRAIN)


def load_run_data(data_args) -> dict[str, datasets.Dataset]:
    """The splits of a training run's data flags (training/arguments.py DataArguments); a missing, misaligned or
    unreadable file, an empty split, or no training split, is a one-line SystemExit."""
    files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
    try:
        splits = load_splits(data_args.source_lang, data_args.target_lang, data_args.dataset_name,
                             data_args.dataset_config_name, files, data_args.streaming)
    except (OSError, ValueError) as error:
        raise SystemExit(f"error: {error}") from None
    if "train" not in splits:
        raise SystemExit("error: no training data: give --dataset_name or --train_file (or neither, for the embedded "
                         "data)")
    for split, rows in splits.items():
        if next(iter(rows.take(1)), None) is None:
            raise SystemExit(f"error: the {split} split has no pairs ({files.get(split) or data_args.dataset_name})")
    return splits
