"""The training pairs as token ids, tokenized once into an Arrow dataset in the run's folder (`RUN/tokens/`).

The main process tokenizes the pairs with the fast tokenizer in batched `datasets.map` calls (over the machine's
cores for a large corpus) and saves them; every process then opens the folder memory-mapped
(`datasets.load_from_disk`), reads the lengths as arrays for §5.1's batching, and reads only the rows of its own
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


def fingerprint(pairs: list[tuple[str, str]], tokenizer_file: Path) -> dict[str, str]:
    """SHA-256 of the pairs, in order, and of the tokenizer's file."""
    digest = hashlib.sha256()
    for source, target in pairs:
        digest.update(f"{len(source)}:{source}{len(target)}:{target}".encode())
    return {"pairs": digest.hexdigest(), "tokenizer": hashlib.sha256(tokenizer_file.read_bytes()).hexdigest()}


def encode_batch(batch: dict[str, list[str]], backend: Tokenizer) -> dict[str, list]:
    sources, targets = ([e.ids for e in backend.encode_batch_fast(batch[side])] for side in ("source", "target"))
    return {"source_ids": sources, "target_ids": targets, "source_length": [len(ids) for ids in sources],
            "target_length": [len(ids) for ids in targets]}


def build(pairs: list[tuple[str, str]], tokenizer, folder: Path, stamp: dict[str, str]) -> None:
    """Tokenize `pairs` into `folder` (written under another name and renamed when complete)."""
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    raw = datasets.Dataset.from_dict({"source": [s for s, _ in pairs], "target": [t for _, t in pairs]})
    # The ids `tokenizer(text)["input_ids"]` gives, from its Rust tokenizer without offsets (about twice as fast),
    # unpadded and untruncated whatever its file asks for.
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    tokens = raw.map(encode_batch, batched=True, batch_size=1000, fn_kwargs={"backend": backend},
                     remove_columns=raw.column_names, features=FEATURES, new_fingerprint=stamp["pairs"][:32],
                     num_proc=os.cpu_count() if len(pairs) >= PARALLEL_FROM else None)
    tokens.save_to_disk(str(partial / "dataset"))
    (partial / "fingerprint.json").write_text(json.dumps(stamp))
    shutil.rmtree(folder, ignore_errors=True)
    os.replace(partial, folder)


def token_dataset(accelerator, pairs: list[tuple[str, str]], tokenizer, output_dir: Path, say) -> datasets.Dataset:
    """`pairs` as token ids (`source_ids`, `target_ids` and their lengths), memory-mapped from `output_dir/tokens`:
    built by the main process unless it holds these pairs tokenized by this tokenizer, read by every process."""
    folder = output_dir / FOLDER
    if accelerator.is_main_process:
        stamp = fingerprint(pairs, output_dir / "tokenizer.json")
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
                build(pairs, tokenizer, folder, stamp)
            finally:
                datasets.enable_progress_bars()
            say(f"{len(pairs):,} training pairs tokenized into {folder} in {time.time() - start:.1f} s")
    accelerator.wait_for_everyone()
    return datasets.load_from_disk(str(folder / "dataset"))
