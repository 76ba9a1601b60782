"""The training pairs as token ids, tokenized once into an Arrow dataset in the run's folder (`RUN/tokens/`).

The main process tokenizes the pairs with the fast tokenizer's normalizer and BPE (`WordEncoder`: each distinct word
once; a converted model's tokenizer by its own calls, `TokenizerEncoder`) in batched `datasets.map` calls on Arrow
tables (a large corpus over the cores the process may use, `usable_cores`: its affinity, a container's limit) and
saves them; every process then opens the folder memory-mapped (`datasets.Dataset.from_file`), reads the lengths as
arrays for §5.1's batching, and reads only the rows of its own batches. The folder's `fingerprint.json` names the pairs
and the tokenizer it was built from: a resumed run reuses it, and one built from other pairs or another tokenizer is
built again, with a line that says so.
"""

import hashlib
import json
import os
import shutil
import time
import unicodedata
from functools import reduce
from itertools import chain
from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from training.checkpoints import writing
from training.tokenizer import is_joint_bpe
from vaswani_hf.speed.kernels import usable_cores

FOLDER = "tokens"
FEATURES = datasets.Features({"source_ids": datasets.Sequence(datasets.Value("int32")),
                              "target_ids": datasets.Sequence(datasets.Value("int32")),
                              "source_length": datasets.Value("int32"), "target_length": datasets.Value("int32")})
# Text the joint BPE's normalizer may change: a character other than Latin-1's that NFKC and the white space rule
# leave as they are (Latin-1 less its compatibility characters and white space but the space), two spaces, or a space
# at the end (one at the start starts no word either way). Other text is what either normalizer of
# training/tokenizer.py's (with or without spaces) makes of it.
NORMALIZED = "[^" + "".join(f"\\x{{{c:x}}}" for c in range(256) if unicodedata.normalize("NFKC", chr(c)) == chr(c)
                            and (c == 32 or not chr(c).isspace())) + "]|  | $"
# Rows per Arrow record batch: opening a file maps every batch's header page, with the pages the kernel maps around
# it (64 KB), so 1,000-row batches put a fifth of the file in each process's resident memory; 10,000, a fiftieth.
RECORD_BATCH = 10_000
PARALLEL_FROM = 100_000  # pairs; fewer are tokenized in the main process alone (starting workers costs more)


def workers(pairs: int) -> int | None:
    """The processes that tokenize `pairs` pairs: one a core this process may use (not every core of the machine: a
    job given 4 of 128 cores would start 128), or none (the main process alone) for few pairs or one core."""
    cores = usable_cores()
    return cores if cores > 1 and pairs >= PARALLEL_FROM else None


def fingerprint(rows: datasets.Dataset, tokenizer, folder: Path) -> dict[str, str]:
    """The pairs' datasets fingerprint (of their files, or their content) and the SHA-256 of the tokenizer's files
    saved in `folder` (run.py's joint BPE: tokenizer.json; a converted model's: its vocabularies and models)."""
    files = [folder / name for name in tokenizer.vocab_files_names.values() if (folder / name).is_file()]
    return {"pairs": rows._fingerprint,
            "tokenizer": hashlib.sha256(b"".join(path.read_bytes() for path in files)).hexdigest()}


def pair_encoder(tokenizer):
    """What tokenizes the pairs: `WordEncoder` for run.py's joint BPE, else `TokenizerEncoder`."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return WordEncoder(tokenizer) if backend is not None and is_joint_bpe(backend) else TokenizerEncoder(tokenizer)


class TokenizerEncoder:
    """The tokenizer's own ids of a column of text, `tokenizer(texts)` for sources and `tokenizer(text_target=texts)`
    for targets: for a converted model's tokenizer (SentencePiece, Moses and BPE, a vocabulary a side), which
    `WordEncoder` does not read."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def encode_column(self, texts: pa.Array, target: bool = False) -> pa.ListArray:
        texts = texts.to_pylist()
        ids = (self.tokenizer(text_target=texts) if target else self.tokenizer(texts))["input_ids"]
        return pa.array(ids, pa.list_(pa.int32()))


class WordEncoder:
    """`tokenizer(texts)["input_ids"]` for the joint BPE of training/tokenizer.py, several times faster on a corpus:
    a column of text at a time, in Arrow's compute functions, with each distinct word through the BPE model once.

    That tokenizer normalizes (NFKC, white space as single spaces), turns every space into ▁ and starts a word at each
    (Metaspace), runs BPE on each word, and appends </s>. Here the normalizer runs only on text it could change
    (`NORMALIZED`): NFKC leaves Latin-1 text without compatibility characters as it is, whatever the Unicode version
    (Latin-1 holds no combining marks), and the white space rule single spaces between words. The words of a column
    are split and numbered by Arrow (`dictionary_encode`), each distinct word is looked up in a bounded cache of its
    BPE ids, and the ids are gathered with numpy. Text that holds a special token's string takes the tokenizer's own
    path. tests/test_data.py checks the ids against the tokenizer's (either normalizer), odd text included.
    """

    CACHE_WORDS = 500_000  # about 100 MB at most; a corpus's frequent words stay (it is emptied when full)

    def __init__(self, tokenizer):
        self.backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        if not is_joint_bpe(self.backend):
            raise ValueError("WordEncoder reads only the joint BPE of training/tokenizer.py")
        self.backend.no_padding()
        self.backend.no_truncation()
        self.specials = [token.content for token in self.backend.get_added_tokens_decoder().values()]
        self.eos_id = self.backend.token_to_id("</s>")
        self.words: dict[str, list[int]] = {}

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return self.encode_column(pa.array(texts, pa.string())).to_pylist()

    def encode_column(self, texts: pa.Array, target: bool = False) -> pa.ListArray:
        """The ids of each text of an Arrow string column, </s> appended (the same on either side: `target`)."""
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        original = texts
        odd = pc.match_substring_regex(texts, NORMALIZED)
        if pc.any(odd).as_py():
            changed = [self.backend.normalizer.normalize_str(text) for text in texts.filter(odd).to_pylist()]
            texts = pc.replace_with_mask(texts, odd, pa.array(changed, texts.type))
        if pc.any(pc.match_substring(texts, "▁")).as_py():
            texts = pc.replace_substring(texts, "▁", " ")
        # A word starts at each space (a space first in the text starts none); "" has no words at all.
        texts = pc.if_else(pc.equal(texts, ""), pa.scalar(None, texts.type),
                           pc.replace_substring_regex(texts, "^ ", "", max_replacements=1))
        words = pc.split_pattern(texts, " ")
        numbered = pc.dictionary_encode(words.flatten())
        if len(self.words) > self.CACHE_WORDS:
            self.words.clear()
        known = [self._ids(word) for word in numbered.dictionary.to_pylist()]  # each distinct word's ids
        counts = np.fromiter(map(len, known), np.int64, len(known))
        flat, first = np.fromiter(chain.from_iterable(known), np.int32, int(counts.sum())), np.cumsum(counts) - counts
        # The ids of every word of the column in order (word w's are flat[first[w]:first[w] + counts[w]]) ...
        word = numbered.indices.to_numpy()
        lengths = counts[word]
        ends = np.cumsum(lengths)
        ids = flat[np.arange(ends[-1] if len(ends) else 0) + np.repeat(first[word] - (ends - lengths), lengths)]
        # ... then each text's words' ids and </s>.
        ids_before = np.r_[0, ends][words.offsets.to_numpy()]  # ids before each text's first word
        offsets = np.r_[0, np.cumsum(np.diff(ids_before) + 1)]
        column = np.full(len(ids) + len(texts), self.eos_id, np.int32)
        is_word = np.ones(len(column), bool)
        is_word[offsets[1:] - 1] = False
        column[is_word] = ids
        encoded = pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), pa.array(column))
        special = reduce(pc.or_, [pc.match_substring(original, token) for token in self.specials])
        if pc.any(special).as_py():
            lists = encoded.to_pylist()
            for row in np.flatnonzero(special.to_numpy(zero_copy_only=False)):
                lists[row] = self.backend.encode(original[row].as_py()).ids
            encoded = pa.array(lists, pa.list_(pa.int32()))
        return encoded

    def _ids(self, word: str) -> list[int]:
        ids = self.words.get(word)
        if ids is None:
            ids = self.words[word] = [token.id for token in self.backend.model.tokenize("▁" + word)]
        return ids


def encode_batch(batch, encoder: WordEncoder | TokenizerEncoder) -> pa.Table | dict[str, list]:
    """A batch of pairs (an Arrow table, or a dict of lists) as ids and lengths, in the same form."""
    arrow = isinstance(batch, pa.Table)
    sources, targets = (encoder.encode_column(batch[side] if arrow else pa.array(batch[side], pa.string()),
                                              target=side == "target") for side in ("source", "target"))
    table = pa.table({"source_ids": sources, "target_ids": targets, "source_length": pc.list_value_length(sources),
                      "target_length": pc.list_value_length(targets)})
    return table if arrow else table.to_pydict()


def build(rows: datasets.Dataset, tokenizer, folder: Path, stamp: dict[str, str]) -> None:
    """Tokenize `rows` into `folder` (written under another name and renamed when complete)."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with writing(folder.parent, f"{folder.name}/", partial):  # a full disk: one line, the room given back
        partial.mkdir(parents=True)
        rows.with_format("arrow").map(  # encode_batch reads and returns Arrow tables: no Python lists
            encode_batch, batched=True, batch_size=RECORD_BATCH, writer_batch_size=RECORD_BATCH,
            fn_kwargs={"encoder": pair_encoder(tokenizer)}, remove_columns=rows.column_names, features=FEATURES,
            load_from_cache_file=False,
            cache_file_name=str(partial / "tokens.arrow"),  # in the run's folder, not datasets' cache
            new_fingerprint=hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32],
            num_proc=workers(len(rows)))
        (partial / "fingerprint.json").write_text(json.dumps(stamp), encoding="utf-8")
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(partial, folder)


def token_dataset(accelerator, rows: datasets.Dataset, tokenizer, output_dir: Path, say) -> datasets.Dataset:
    """`rows` (their `source` and `target`) as token ids (`source_ids`, `target_ids` and their lengths),
    memory-mapped from `output_dir/tokens`: built by the main process unless it holds these pairs tokenized by this
    tokenizer, read by every process."""
    folder = output_dir / FOLDER
    if accelerator.is_main_process:
        stamp = fingerprint(rows, tokenizer, output_dir)
        try:
            stored = json.loads((folder / "fingerprint.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            stored = None
        if stored != stamp:
            if folder.exists():
                say(f"{folder} was tokenized from other pairs or by another tokenizer: tokenizing again")
            start = time.time()
            datasets.disable_progress_bars()
            try:
                build(rows, tokenizer, folder, stamp)
            finally:
                datasets.enable_progress_bars()
            say(f"{len(rows):,} training pairs tokenized into {folder} in {time.time() - start:.1f} s")
    accelerator.wait_for_everyone()
    # tokens.arrow, or with worker processes tokens_00000_of_0000N.arrow, ...: in order when sorted
    return datasets.concatenate_datasets([datasets.Dataset.from_file(str(path))
                                          for path in sorted(folder.glob("tokens*.arrow"))])
