"""The training pairs as token ids, tokenized once into an Arrow dataset in the run's folder (`RUN/tokens/`).

The main process tokenizes the pairs with the fast tokenizer's normalizer and BPE (`WordEncoder`: each distinct word
once) in batched `datasets.map` calls (over the machine's cores for a large corpus) and saves them; every process
then opens the folder memory-mapped (`datasets.Dataset.from_file`), reads the lengths as arrays for §5.1's batching,
and reads only the rows of its own batches. The folder's `fingerprint.json` names the pairs and the tokenizer it was
built from: a resumed run reuses it, and one built from other pairs or another tokenizer is built again, with a line
that says so.
"""

import hashlib
import json
import os
import re
import shutil
import time
import unicodedata
from itertools import chain
from pathlib import Path

import datasets
from tokenizers import Tokenizer

from training.tokenizer import is_joint_bpe

FOLDER = "tokens"
FEATURES = datasets.Features({"source_ids": datasets.Sequence(datasets.Value("int32")),
                              "target_ids": datasets.Sequence(datasets.Value("int32")),
                              "source_length": datasets.Value("int32"), "target_length": datasets.Value("int32")})
BEYOND_LATIN_1 = re.compile("[^\x00-\xff]")
# Rows per Arrow record batch: opening a file maps every batch's header page, with the pages the kernel maps around
# it (64 KB), so 1,000-row batches put a fifth of the file in each process's resident memory; 10,000, a fiftieth.
RECORD_BATCH = 10_000
PARALLEL_FROM = 100_000  # pairs; fewer are tokenized in the main process alone (starting workers costs more)


def fingerprint(rows: datasets.Dataset, tokenizer_file: Path) -> dict[str, str]:
    """The pairs' datasets fingerprint (of their files, or their content) and the SHA-256 of the tokenizer's file."""
    return {"pairs": rows._fingerprint, "tokenizer": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()}


class WordEncoder:
    """`tokenizer(texts)["input_ids"]` for the joint BPE of training/tokenizer.py, several times faster on a corpus.

    That tokenizer normalizes (NFKC), turns every space into ▁ and starts a word at each (Metaspace), runs BPE on
    each word, and appends </s>. Here each distinct word goes through its BPE model once and is looked up after
    that (a bounded cache), and the normalizer runs only on text it could change: NFKC leaves Latin-1 text without
    compatibility characters as it is, whatever the Unicode version. Text that holds a special token's string takes
    the tokenizer's own path. tests/test_data.py checks the ids against the tokenizer's, odd text included.
    """

    CACHE_WORDS = 500_000  # about 100 MB at most; a corpus's frequent words stay (it is emptied when full)

    def __init__(self, tokenizer):
        self.backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
        if not is_joint_bpe(self.backend):
            raise ValueError("WordEncoder reads only the joint BPE of training/tokenizer.py")
        self.backend.no_padding()
        self.backend.no_truncation()
        self.special = re.compile("|".join(re.escape(token.content) for token in
                                           self.backend.get_added_tokens_decoder().values()))
        self.eos_id = self.backend.token_to_id("</s>")
        self.words: dict[str, list[int]] = {}

    def __call__(self, texts: list[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def encode(self, text: str) -> list[int]:
        if self.special.search(text):
            return self.backend.encode(text).ids
        if not (text.isascii() or (not BEYOND_LATIN_1.search(text) and unicodedata.is_normalized("NFKC", text))):
            text = self.backend.normalizer.normalize_str(text)
        if not text:
            return [self.eos_id]
        words = text.replace(" ", "▁").removeprefix("▁").split("▁")  # the words, less the ▁ each starts with
        try:
            ids = list(chain.from_iterable(map(self.words.__getitem__, words)))
        except KeyError:
            if len(self.words) > self.CACHE_WORDS:
                self.words.clear()
            for word in words:
                if word not in self.words:
                    self.words[word] = [token.id for token in self.backend.model.tokenize("▁" + word)]
            ids = list(chain.from_iterable(map(self.words.__getitem__, words)))
        ids.append(self.eos_id)
        return ids


def encode_batch(batch: dict[str, list[str]], encoder: WordEncoder) -> dict[str, list]:
    sources, targets = encoder(batch["source"]), encoder(batch["target"])
    return {"source_ids": sources, "target_ids": targets, "source_length": [len(ids) for ids in sources],
            "target_length": [len(ids) for ids in targets]}


def build(rows: datasets.Dataset, tokenizer, folder: Path, stamp: dict[str, str]) -> None:
    """Tokenize `rows` into `folder` (written under another name and renamed when complete)."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    rows.map(encode_batch, batched=True, batch_size=RECORD_BATCH, writer_batch_size=RECORD_BATCH,
             fn_kwargs={"encoder": WordEncoder(tokenizer)}, remove_columns=rows.column_names, features=FEATURES,
             load_from_cache_file=False,
             cache_file_name=str(partial / "tokens.arrow"),  # in the run's folder, not datasets' cache
             new_fingerprint=hashlib.sha256(json.dumps(stamp).encode()).hexdigest()[:32],
             num_proc=os.cpu_count() if len(rows) >= PARALLEL_FROM else None)
    (partial / "fingerprint.json").write_text(json.dumps(stamp))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)


def token_dataset(accelerator, rows: datasets.Dataset, tokenizer, output_dir: Path, say) -> datasets.Dataset:
    """`rows` (their `source` and `target`) as token ids (`source_ids`, `target_ids` and their lengths),
    memory-mapped from `output_dir/tokens`: built by the main process unless it holds these pairs tokenized by this
    tokenizer, read by every process."""
    folder = output_dir / FOLDER
    if accelerator.is_main_process:
        stamp = fingerprint(rows, output_dir / "tokenizer.json")
        try:
            stored = json.loads((folder / "fingerprint.json").read_text())
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
