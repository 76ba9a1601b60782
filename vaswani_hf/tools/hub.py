# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""`vaswani-push`: a finished model folder published as a Hub model repository.

    vaswani-push outputs/run org/name              # public
    vaswani-push outputs/run org/name --private

What goes up is the model and nothing of its training: the weights, `config.json`, `generation_config.json` (the
paper's decoding), the code files (the model, the GNMT search, the pipeline), the tokenizer and the model card
`README.md` — not the checkpoints, optimizer states, schedule, metrics or logs beside them. `training/run.py
--push_to_hub` sends the same files at the end of a run. The token is huggingface_hub's own (`HF_TOKEN` or
`hf auth login`); it is never read, printed or written here.
"""

import argparse
import json
from pathlib import Path

from transformers import AutoModelForSeq2SeqLM

from .loading import first_line, loaded_whole
from .text import utf8_output

REQUIRED = ("config.json", "generation_config.json", "README.md")
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json")
# The files a tokenizer reads, by its class (tokenizer_config.json names it): ours, tokenizers' JSON; the SentencePiece
# models and vocabulary of Marian's and the Moses + BPE files of fairseq's, which vaswani-convert writes.
TOKENIZER_FILES = {"TokenizersBackend": ("tokenizer.json",),
                   "MarianTokenizer": ("source.spm", "target.spm", "vocab.json"),
                   "FSMTTokenizer": ("vocab-src.json", "vocab-tgt.json", "merges.txt")}


def is_weights(name: str) -> bool:
    """model.safetensors, or the shards and index of a sharded save."""
    return name.startswith("model") and name.endswith((".safetensors", ".safetensors.index.json"))


def published_files(folder: Path) -> list[str]:
    """The files of `folder` that its Hub repository holds (module docstring). A folder that is not a finished
    vaswani_hf model is a one-line ValueError naming what it lacks, or the file that is damaged."""
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type != "vaswani":
        raise ValueError(f"{folder}: not a vaswani_hf model folder (no config.json of model_type \"vaswani\")")
    names = sorted(path.name for path in folder.iterdir() if path.is_file())
    try:
        tokenizer_config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        tokenizer_class = tokenizer_config.get("tokenizer_class")
    except (OSError, ValueError, AttributeError):
        tokenizer_class = None
    required = (*TOKENIZER_FILES.get(tokenizer_class, ("tokenizer.json",)), *REQUIRED)
    missing = [name for name in required if name not in names]
    if not any(map(is_weights, names)):
        missing.insert(0, "model.safetensors")
    if missing:
        raise ValueError(f"{folder}: not a finished model folder, no {', '.join(missing)} (written when a run ends)")
    files = [name for name in names
             if name in required or name in TOKENIZER_EXTRAS or name.endswith(".py") or is_weights(name)]
    for name in files:
        check_readable(folder / name)
    return files


def check_readable(path: Path) -> None:
    """A JSON file that parses, a safetensors file whose header reads; else a one-line ValueError."""
    from safetensors import safe_open

    try:
        if path.suffix == ".json":
            json.loads(path.read_text(encoding="utf-8"))
        elif path.suffix == ".safetensors":
            with safe_open(path, framework="pt"):
                pass
    except Exception as error:  # noqa: BLE001 - JSON, encoding and safetensors errors alike
        raise ValueError(f"{path} is damaged: {first_line(error)}") from None


def push(folder: Path, repo_id: str, private: bool = False) -> str:
    """Create the model repository if needed (private if asked) and upload `published_files(folder)`; its URL."""
    from huggingface_hub import HfApi

    files = published_files(folder)
    loaded_whole(AutoModelForSeq2SeqLM, str(folder))  # weights that do not fit their config are not published
    api = HfApi()
    repo = api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    api.upload_folder(repo_id=repo.repo_id, folder_path=str(folder), allow_patterns=files,
                      commit_message="Upload a vaswani_hf model")
    return str(repo)


def check_can_push(repo_id: str) -> None:
    """Before a run that pushes to `repo_id` at its end: one line now, not after the training, if it could not
    (a name the Hub refuses, offline, or no token)."""
    from huggingface_hub import constants, get_token
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise SystemExit(f"error: --push_to_hub to {repo_id!r}: {first_line(error)} (--hub_model_id names it; "
                         "default: --output_dir's last folder)") from None
    if constants.HF_HUB_OFFLINE:
        raise SystemExit("error: --push_to_hub, but HF_HUB_OFFLINE is set: the run could not push at its end")
    if get_token() is None:
        raise SystemExit("error: --push_to_hub needs a Hugging Face token: hf auth login, or set HF_TOKEN")


def push_or_exit(folder: Path, repo_id: str, private: bool = False) -> str:
    """`push` for the command lines: a folder that is not a finished model, or a Hub that refuses or cannot be reached
    (offline, no token, no access, no network), exits with one line; the folder is left as it was."""
    from huggingface_hub.errors import HTTPError  # its HTTP client's (httpx's, httpx2's): a failed connection's

    try:
        return push(folder, repo_id, private=private)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    except (OSError, HTTPError) as error:  # huggingface_hub's own errors are OSErrors too
        raise SystemExit(f"error: pushing {folder} to {repo_id} failed: {first_line(error)} (to try again: "
                         f"vaswani-push {folder} {repo_id})") from None


def main(argv: list[str] | None = None) -> None:
    utf8_output()
    parser = argparse.ArgumentParser(prog="vaswani-push", description=__doc__.splitlines()[0].split(": ", 1)[1])
    parser.add_argument("folder", help="a model folder written by training/run.py or training/run_trainer.py")
    parser.add_argument("repo_id", help="the Hub repository, e.g. org/name (created if it does not exist)")
    parser.add_argument("--private", action="store_true", help="create the repository private")
    args = parser.parse_args(argv)
    if not args.folder.strip():  # Path("") would be the current folder
        raise SystemExit("error: the folder is blank: give the model's folder")
    print(f"pushed {args.folder} to {push_or_exit(Path(args.folder), args.repo_id, private=args.private)}")


if __name__ == "__main__":
    main()
