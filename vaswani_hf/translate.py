"""Translate text with a trained model: `vaswani-translate --model folder_or_repo < input.txt > output.txt`.

Decodes the paper's way (§6.1): beam search with the GNMT length penalty and a limit of source length + 50, with
the beam size and α the model was saved with (else the paper's 4 and 0.6), using this package's code (no remote
code runs). One output line per input line, in order;
an empty line stays empty.

    vaswani-translate --model outputs/run --input sources.txt --output translations.txt --batch_size 32
    echo "A man is riding a bike." | vaswani-translate --model outputs/run --num_beams 1 --device cpu
    vaswani-translate --model outputs/run --int8 < sources.txt     # int8 linear layers on the CPU (quantization.py)
"""

import argparse
import sys
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer
from transformers.utils.logging import disable_progress_bar

from .allocator import keep_freed_memory
from .gnmt import gnmt_beam_search
from .kernels import MEASURED_ATTENTION
from .quantization import quantize_int8
from .text import decode_utf8, split_lines


def load(name_or_path: str, device: str = "auto", int8: bool = False):
    """(model, tokenizer) from a model folder or Hub repository, in eval mode on `device` (with `int8`: the CPU
    model's int8 copy); a missing or broken model exits with a one-line message."""
    if device == "auto":
        device = "cpu" if int8 or not torch.cuda.is_available() else "cuda"
    if int8 and device != "cpu":
        raise SystemExit(f"error: int8 runs on the CPU, not on {device}")
    try:
        kind = torch.device(device).type
    except RuntimeError:
        raise SystemExit(f"error: --device {device}: not a device (cpu, cuda, cuda:1, ...)") from None
    if kind == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"error: --device {device}: this machine has no CUDA GPU that torch can use")
    path = Path(name_or_path)
    # A Hub id is "name" or "owner/name"; a path whose folder exists here is local, and is not sent to the Hub.
    local = path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or (
        path.parent != Path(".") and path.parent.is_dir())
    if local and not (path / "config.json").is_file():
        raise SystemExit(f"error: {name_or_path} is not a model folder (no config.json there)")
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        # On the CPU, decoding steps take SDPA or the eager product, whichever is measured faster (kernels.py).
        model = AutoModelForSeq2SeqLM.from_pretrained(name_or_path, attn_implementation=MEASURED_ATTENTION)
    except Exception as error:  # transformers raises OSError, ValueError, KeyError, ... for unusable folders
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise SystemExit(f"error: cannot load a model from {name_or_path}: {message}") from None
    if tokenizer.pad_token_id is None:
        raise SystemExit(f"error: the tokenizer of {name_or_path} has no padding token (is tokenizer_config.json missing?)")
    return (quantize_int8(model) if int8 else model.to(device).eval()), tokenizer


@torch.no_grad()
def translate(model, tokenizer, sources: list[str], batch_size: int = 64, num_beams: int | None = None,
              alpha: float | None = None) -> list[str]:
    """Translations in the order of `sources`, by the paper's beam search; batches are formed from sources of
    similar length. The beam size and α default to the model's generation config (`num_beams`, `gnmt_alpha`, as
    training/run.py saves them), else to the paper's 4 and 0.6."""
    training = model.training
    model.eval()
    num_beams = num_beams or getattr(model.generation_config, "num_beams", None) or 4
    alpha = alpha if alpha is not None else getattr(model.generation_config, "gnmt_alpha", 0.6)
    device = next(model.parameters()).device
    order = sorted(range(len(sources)), key=lambda i: len(sources[i]))
    translations = [""] * len(sources)
    try:
        for start in range(0, len(order), batch_size):
            indices = [i for i in order[start : start + batch_size] if sources[i].strip()]
            if not indices:
                continue
            inputs = tokenizer([sources[i] for i in indices], padding=True, return_tensors="pt").to(device)
            output = gnmt_beam_search(model, inputs["input_ids"], inputs["attention_mask"], num_beams, alpha)
            for i, text in zip(indices, tokenizer.batch_decode(output, skip_special_tokens=True)):
                translations[i] = text
    finally:
        model.train(training)  # the caller's mode back: a training loop goes on training
    return translations


def check_lengths(config, tokenizer, sources: list[str]) -> None:
    """Learned positions stop at max_position_embeddings: a longer source is a one-line error before any decoding."""
    if config.position_embedding != "learned":
        return
    lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]]
    for number, length in enumerate(lengths, 1):
        if length > config.max_position_embeddings:
            raise SystemExit(f"error: line {number} has {length} tokens; this model's learned positions stop at "
                             f"{config.max_position_embeddings}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vaswani-translate", description="Translate lines of text (§6.1 decoding).")
    parser.add_argument("--model", required=True, help="A model folder or Hub repository id.")
    parser.add_argument("--input", help="A text file, one source per line (default: stdin).")
    parser.add_argument("--output", help="Where the translations go (default: stdout).")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--num_beams", type=int, help="Beam size (default: the model's generation config, else 4).")
    parser.add_argument("--alpha", type=float, help="GNMT length penalty α (default: the model's gnmt_alpha, else 0.6).")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: a GPU if there is one).")
    parser.add_argument("--int8", action="store_true", help="Int8 linear layers on the CPU (faster; a deviation).")
    args = parser.parse_args(argv)
    if args.batch_size < 1 or (args.num_beams is not None and args.num_beams < 1):
        parser.error("--batch_size and --num_beams must be at least 1")
    if args.input and not Path(args.input).is_file():
        raise SystemExit(f"error: --input {args.input}: no such file")
    if args.output and (Path(args.output).is_dir() or not Path(args.output).resolve().parent.is_dir()):
        raise SystemExit(f"error: --output {args.output}: not a file in an existing folder")

    try:
        data = Path(args.input).read_bytes() if args.input else sys.stdin.buffer.read()
        sources = split_lines(decode_utf8(data, args.input or "the standard input"))
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None

    keep_freed_memory()  # the decoding steps reuse the (beams x vocabulary) blocks they free (allocator.py)
    disable_progress_bar()  # stderr keeps to errors
    model, tokenizer = load(args.model, args.device, args.int8)
    check_lengths(model.config, tokenizer, sources)
    translations = translate(model, tokenizer, sources, args.batch_size, args.num_beams, args.alpha)
    result = "".join(line.replace("\n", " ") + "\n" for line in translations)  # one line for each line read
    if args.output:
        Path(args.output).write_text(result, encoding="utf-8")
    else:
        sys.stdout.write(result)


if __name__ == "__main__":
    main()
