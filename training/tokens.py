"""The training pairs as token ids, tokenized once into an Arrow dataset in the run's folder (`RUN/tokens/`).

The main process tokenizes the pairs with the fast tokenizer in batched `datasets.map` calls (over the machine's
cores for a large corpus) and saves them; every process then opens the folder memory-mapped
(`datasets.Dataset.from_file`), reads the lengths as arrays for §5.1's batching, and reads only the rows of its own
batches. The folder's `fingerprint.json` names the pairs and the tokenizer it was built from: a resumed run reuses
it, and one built from other pairs or another tokenizer is built again, with a line that says so.
"""

import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import datasets
from tokenizers import Tokenizer

FOLDER = "tokens"
FEATURES = datasets.Features({"source_ids": datasets.Sequence(datasets.Value("int32")),
                              "target_ids": datasets.Sequence(datasets.Value("int32")),
                              "source_length": datasets.Value("int32"), "target_length": datasets.Value("int32")})
PARALLEL_FROM = 100_000  # pairs; fewer are tokenized in the main process alone (starting workers costs more)


def fingerprint(rows: datasets.Dataset, tokenizer_file: Path) -> dict[str, str]:
    """The pairs' datasets fingerprint (of their files, or their content) and the SHA-256 of the tokenizer's file."""
    return {"pairs": rows._fingerprint, "tokenizer": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()}


def encode_batch(batch: dict[str, list[str]], backend: Tokenizer) -> dict[str, list]:
    sources, targets = ([e.ids for e in backend.encode_batch_fast(batch[side])] for side in ("source", "target"))
    return {"source_ids": sources, "target_ids": targets, "source_length": [len(ids) for ids in sources],
            "target_length": [len(ids) for ids in targets]}


def build(rows: datasets.Dataset, tokenizer, folder: Path, stamp: dict[str, str]) -> None:
    """Tokenize `rows` into `folder` (written under another name and renamed when complete)."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    # The ids `tokenizer(text)["input_ids"]` gives, from its Rust tokenizer without offsets (about twice as fast),
    # unpadded and untruncated whatever its file asks for.
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    partial.mkdir(parents=True)
    rows.map(encode_batch, batched=True, batch_size=1000, fn_kwargs={"backend": backend},
             remove_columns=rows.column_names, features=FEATURES, load_from_cache_file=False,
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
