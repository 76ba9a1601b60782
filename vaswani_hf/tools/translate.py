"""Translate text with a trained model: `vaswani-translate --model folder_or_repo < input.txt > output.txt`.

Decodes the paper's way (§6.1): beam search with the GNMT length penalty and a limit of source length + 50, with
the beam size, α and limit the model was saved with (else the paper's 4, 0.6 and 50), using this package's code (no
remote code runs); a converted model (`vaswani-convert`) decodes as its source was published unless `--alpha` is given.
Made for large files: lines are read a window at a time, sorted by length inside the window and cut into batches of
at most `--max_tokens` source tokens (padding included), so memory stays bounded; translations are written as their
batches finish, in input order, one output line per input line (an empty line stays empty); a progress bar on
stderr counts lines and tokens/s (an `--input` file is counted first, and a byte in it that is not UTF-8 stops the
command before the model loads; a line longer than the engine's positions, before any line is decoded). Lines typed at
a terminal are translated one by one, as each is entered.

    vaswani-translate --model outputs/run --input sources.txt --output translations.txt --max_tokens 4096
    vaswani-translate --model outputs/run --input sources.txt --output translations.txt --resume  # after a kill
    echo "A man is riding a bike." | vaswani-translate --model outputs/run --num_beams 1 --device cpu
    vaswani-translate --model outputs/run --int8 < sources.txt     # int8 linear layers on the CPU (quantization.py)
    vaswani-translate --model outputs/run --nbest 4 < sources.txt  # "line ||| translation ||| score", 4 per line
    vaswani-translate --model outputs/run --engine ctranslate2 < sources.txt   # the CTranslate2 export

On a CPU the float32 model is transformed by `vaswani_hf.fast_cpu` (what whole calls were measured faster with, on
this machine, once); `--no_fast_cpu` decodes as the model files are written. `--engine ctranslate2` decodes with the
model's CTranslate2 export instead (ctranslate2_engine.py's `CTranslate2Engine`, converted once into a cache): the same
greedy tokens, its own beam search (log P / |Y|^α). In Python, `load_engine` gives either engine and `translate` or
`translations` decode with it:

    engine, tokenizer = load_engine("outputs/run", "ctranslate2")
    translate(engine, tokenizer, ["A man is riding a bike."])
"""

import argparse
import codecs
import contextlib
import itertools
import lzma
import math
import os
import signal
import sys
import time
import zlib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm
from transformers.utils.logging import disable_progress_bar

from ..gnmt import check_alpha, check_whole, extra_length_of, gnmt_beam_search, logits_processors, output_limits
from ..speed.allocator import keep_freed_memory
from .loading import check_gpu, checked, device_kind, learned_positions, load, one_line_errors
from .text import decode_utf8, opened, refused_write, split_lines

MAX_TOKENS = 4096  # source tokens per batch, padding included
WINDOW = 2000  # lines read, sorted by length and batched together


def load_engine(name_or_path: str, engine: str = "torch", device: str = "auto", int8: bool = False,
                fast: bool = True):
    """(engine, tokenizer): the torch model (`load`, `TorchEngine`) or its CTranslate2 export (ctranslate2_engine.py's
    `CTranslate2Engine`) on `device` (auto: a GPU if the engine finds one), int8 with `int8`."""
    if engine == "torch":
        model, tokenizer = load(name_or_path, device, int8, fast)
        return TorchEngine(model, tokenizer), tokenizer
    try:
        import ctranslate2

        from .ctranslate2_engine import CTranslate2Engine
    except ImportError:
        raise SystemExit('error: --engine ctranslate2 needs ctranslate2: pip install ctranslate2 (or pip install '
                         '"vaswani_hf[export]")') from None
    gpus = ctranslate2.get_cuda_device_count()
    if device == "auto":
        device = "cuda" if gpus else "cpu"
    kind = device_kind(device)
    if kind not in ("cpu", "cuda"):
        raise SystemExit(f"error: --device {device}: CTranslate2 runs on cpu or cuda")
    if kind == "cuda":
        check_gpu(device, gpus, "CTranslate2")
    config, tokenizer = checked(name_or_path)
    with one_line_errors(name_or_path):  # weights missing or damaged, a model CTranslate2 cannot hold
        return CTranslate2Engine(name_or_path, config, tokenizer, device, int8), tokenizer


class Translation(NamedTuple):
    index: int  # of the source
    hypotheses: list[tuple[str, float]]  # (text, log P / GNMT penalty), best first
    tokens: int  # of the best hypothesis, EOS included


def token_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices sorted by length, cut so that a batch's rows × its longest length stay within `max_tokens` (a longer
    source makes a batch of its own)."""
    batches, batch = [], []
    for index in sorted(range(len(lengths)), key=lengths.__getitem__):  # each one is the longest of its batch so far
        if batch and (len(batch) + 1) * lengths[index] > max_tokens:
            batches.append(batch)
            batch = []
        batch.append(index)
    return [*batches, batch] if batch else batches


def translations(model, tokenizer, sources: list[str], max_tokens: int = MAX_TOKENS, num_beams: int | None = None,
                 alpha: float | None = None, nbest: int = 1) -> Iterator[Translation]:
    """The paper's beam search over `sources`, batch by batch (`token_batches`), yielding each source's `nbest`
    hypotheses as its batch finishes; blank sources are skipped. The beam size and α default to the model's
    generation config (`num_beams`, `gnmt_alpha`, as training/run.py saves them), else to the paper's 4 and 0.6.
    A generation config of the model's own without `gnmt_alpha` (a converted model's: vaswani-convert) is the
    decoding it was published with: without `alpha`, transformers' `generate()` runs it. `model`: a torch model,
    or an engine that decodes token batches (`TorchEngine`, ctranslate2_engine.py's `CTranslate2Engine`,
    onnx_runtime.py's `OnnxSeq2Seq`). A source longer than the engine's `positions` (learned ones) is a one-line
    ValueError before any batch is decoded."""
    engine = as_engine(model, tokenizer)
    config = engine.generation_config
    num_beams = num_beams if num_beams is not None else getattr(config, "num_beams", None) or 4
    check_request(sources, num_beams, max_tokens, nbest, alpha)
    if alpha is None and papers_decoding(config):
        alpha = getattr(config, "gnmt_alpha", 0.6)
    indices = [i for i, source in enumerate(sources) if source.strip()]
    encoded = tokenizer([sources[i] for i in indices])["input_ids"] if indices else []
    positions, longest = getattr(engine, "positions", None), max(map(len, encoded), default=0)
    if positions is not None and longest > positions:
        raise ValueError(f"a source has {longest} tokens; this model's positions stop at {positions}")
    for batch in token_batches([len(ids) for ids in encoded], max_tokens):
        hypotheses, scores = engine.decode([encoded[j] for j in batch], num_beams, alpha, nbest)
        texts = tokenizer.batch_decode(hypotheses, skip_special_tokens=True)
        for k, j in enumerate(batch):
            rows = slice(k * nbest, (k + 1) * nbest)
            yield Translation(indices[j], list(zip(texts[rows], scores[rows])), len(hypotheses[k * nbest]))


def check_request(sources, num_beams: int, max_tokens: int, nbest: int = 1, alpha: float | None = None) -> None:
    """One line for what a translation cannot take, before anything is decoded: a beam size or `max_tokens` that is
    not a whole number of at least 1, `nbest` hypotheses outside 1 to the beam size, an α that is not a finite number
    of at least 0 (ValueError); `sources` that are not a list (or tuple) of strings (TypeError: a lone string would be
    translated a character at a time)."""
    if alpha is not None:
        check_alpha("alpha", alpha)
    check_whole("num_beams", num_beams, 1)
    check_whole("max_tokens", max_tokens, 1)
    check_whole("nbest", nbest, 1)
    if nbest > num_beams:
        raise ValueError(f"nbest must be at most num_beams={num_beams}, got {nbest}")
    if not isinstance(sources, (list, tuple)):
        raise TypeError(f"sources: a list of strings, got {type(sources).__name__}")
    others = [type(source).__name__ for source in sources if not isinstance(source, str)]
    if others:
        raise TypeError(f"sources: a list of strings, got a list holding {others[0]}")


def papers_decoding(generation) -> bool:
    """Whether a generation config asks for the paper's search: it names `gnmt_alpha` (training/run.py's), or it is
    none of the model's own (made from its config); else it is the decoding a converted model was published with."""
    return getattr(generation, "gnmt_alpha", None) is not None or generation._from_model_config


def as_engine(model, tokenizer):
    """`model` as an engine: a torch model in a `TorchEngine`, an engine as it is."""
    return TorchEngine(model, tokenizer) if isinstance(model, torch.nn.Module) else model


class TorchEngine:
    """Decodes batches of token ids with the torch model: the paper's search, or transformers' `generate()` (`search`).
    `decode` returns each source's `nbest` hypotheses (ids after the start token, EOS included where one ended it),
    best first, and their scores. `positions`: the most tokens a source may have (learned positions), None for any."""

    name = "torch"

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.config, self.generation_config = model.config, model.generation_config
        self.positions = learned_positions(model.config)

    @torch.no_grad()
    def decode(self, batch: list[list[int]], num_beams: int, alpha: float | None,
               nbest: int) -> tuple[list[list[int]], list[float]]:
        training = self.model.training
        self.model.eval()
        try:
            device = next(self.model.parameters()).device
            with getattr(self.model, "fast_decoding", lambda beams: contextlib.nullcontext())(num_beams):  # fast_cpu
                return decoded_batch(self.model, self.tokenizer, batch, num_beams, alpha, nbest, device)
        finally:
            self.model.train(training)  # the caller's mode back: a training loop goes on training


def decoded_batch(model, tokenizer, batch: list[list[int]], num_beams: int, alpha: float | None, nbest: int,
                  device: torch.device | str = "cpu") -> tuple[list[list[int]], list[float]]:
    """An engine's `decode` by `search`: each source's `nbest` hypotheses (ids after the start token, no padding),
    best first, and their scores."""
    inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(device)
    sequences, scores = search(model, inputs, num_beams, alpha, nbest)
    pad = tokenizer.pad_token_id
    return [[i for i in row if i != pad] for row in sequences[:, 1:].tolist()], scores.tolist()


def search(model, inputs, num_beams: int, alpha: float | None, nbest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `nbest` best hypotheses of each row and their scores: the paper's search with GNMT α (log P / penalty),
    with the logits processors the generation config asks for (an OPUS-MT model's banned <pad> and forced EOS), or,
    without α, transformers' `generate()` with the model's generation config (log P, divided by |Y|^length_penalty
    in beam search)."""
    if alpha is not None:
        config, source, mask = model.generation_config, inputs["input_ids"], inputs["attention_mask"]
        limits = output_limits(model.config, mask, None, extra_length_of(config))
        return gnmt_beam_search(model, source, mask, num_beams, alpha, extra_length=extra_length_of(config),
                                num_return_sequences=nbest, output_scores=True,
                                logits_processor=logits_processors(model, config, source, {}, num_beams, limits))
    found = model.generate(**inputs, num_beams=num_beams, num_return_sequences=nbest, output_scores=True,
                           return_dict_in_generate=True)
    if num_beams > 1:
        return found.sequences, found.sequences_scores
    steps = model.compute_transition_scores(found.sequences, found.scores, normalize_logits=True)  # (B, T - 1)
    decoded = found.sequences[:, 1:].ne(model.generation_config.pad_token_id)  # not the padding after EOS
    return found.sequences, steps.masked_fill(~decoded, 0).sum(-1)


def translate(model, tokenizer, sources: list[str], max_tokens: int = MAX_TOKENS, num_beams: int | None = None,
              alpha: float | None = None) -> list[str]:
    """The best translation of each source, in order (`translations`); blank sources give empty strings."""
    done = translations(model, tokenizer, sources, max_tokens, num_beams, alpha)
    best = {translation.index: translation.hypotheses[0][0] for translation in done}
    return [best.get(index, "") for index in range(len(sources))]


def read_windows(stream: Iterable[bytes], name: str, size: int = WINDOW,
                 first: int = 1) -> Iterator[tuple[int, list[str]]]:
    """(number of the window's first line, its lines), `size` lines at a time from a binary stream whose first line is
    line `first`, split at newlines only (text.py); a window that is not UTF-8 stops the program with one line naming
    its line."""
    chunk = []
    for raw in itertools.chain(stream, [None]):  # binary streams split at b"\n" only; None: the end
        if raw is not None:
            chunk.append(raw)
        if chunk and (len(chunk) == size or raw is None):
            yield first, split_lines(utf8_text(b"".join(chunk), name, first))
            first, chunk = first + size, []


def utf8_text(data: bytes, name: str, first_line: int) -> str:
    """text.py's `decode_utf8`, or the program stops with its one line."""
    try:
        return decode_utf8(data, name, first_line)
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None


def check_lengths(engine, tokenizer, sources: list[str], first_line: int = 1) -> None:
    """A source longer than the engine's model has positions for (`engine.positions`: learned ones, a table) is a
    one-line error before it is decoded."""
    if engine.positions is None:
        return
    lengths = [len(ids) for ids in tokenizer(sources)["input_ids"]] if sources else []
    for number, length in enumerate(lengths, first_line):
        if length > engine.positions:
            raise SystemExit(f"error: line {number} has {length} tokens; this model's positions stop at "
                             f"{engine.positions} on the {engine.name} engine")


def output_lines(source: str, hypotheses: list[tuple[str, float]] | None, index: int, nbest: int) -> str:
    """One line for the source, or with --nbest n lines "index ||| translation ||| score" (a blank source: empty
    translations scored 0). Newlines inside a translation become spaces."""
    hypotheses = hypotheses or [("", 0.0)] * nbest
    texts = [text.replace("\n", " ") for text, _ in hypotheses]
    if nbest == 1:
        return texts[0] + "\n"
    return "".join(f"{index} ||| {text} ||| {score:.4f}\n" for text, (_, score) in zip(texts, hypotheses))


def counted_lines(path: str, block_size: int = 1 << 20) -> int:
    """The lines of the file `path` as `read_windows` reads them, counted in one pass before any is translated: a byte
    that is not UTF-8 stops the program there, in read_windows' words."""
    count, last, decoder = 0, b"\n", codecs.getincrementaldecoder("utf-8")()
    with opened(path) as file:
        for block in itertools.chain(iter(lambda: read(file, block_size, path), b""), [b""]):  # b"": the end
            try:
                decoder.decode(block, final=not block)
            except UnicodeDecodeError as error:  # its bytes: a character the last block began, then this block
                utf8_text(error.object, path, count + 1)
            count, last = count + block.count(b"\n"), block[-1:] or last
    return count + (last != b"\n")


def read(file, size: int, path: str) -> bytes:
    """`file.read(size)`; a compressed file that is damaged or cut short stops the program in one line."""
    try:
        return file.read(size)
    except (OSError, EOFError, lzma.LZMAError, zlib.error) as error:
        raise SystemExit(f"error: {path} cannot be read: {error or type(error).__name__}") from None


def translated_part(path: str, nbest: int) -> tuple[int, int]:
    """(input lines, bytes) that the file `path`, a stopped run's OUTPUT.partial, holds whole translations of: `nbest`
    output lines each, each ended by its newline (a line a kill cut short is not one)."""
    done, size, offset = 0, 0, 0
    with open(path, "rb") as file:
        for number, line in enumerate(file, 1):
            if not line.endswith(b"\n"):
                break
            offset += len(line)
            if number % nbest == 0:
                done, size = number // nbest, offset
    return done, size


def skipped(stream: Iterable[bytes], count: int, name: str, partial: str) -> Iterator[bytes]:
    """The lines of a binary stream after its first `count`, which a resumed run translated before; a stream with
    fewer lines is not the one translated into `partial` (one line)."""
    lines = iter(stream)
    for number in range(count):
        if next(lines, None) is None:
            raise SystemExit(f"error: {partial} holds translations of {count} lines, and {name} has {number}: not "
                             "this input's (--overwrite starts again)")
    return lines


def translated_windows(engine, tokenizer, windows: Iterable[tuple[int, list[str]]], max_tokens: int, num_beams: int,
                       alpha: float | None, nbest: int) -> Iterator[tuple[str, int, int]]:
    """(text to write, the input lines it answers, tokens translated) as batches finish, in input order. `engine`: as
    `translations` takes it."""
    engine = as_engine(engine, tokenizer)
    for first_line, window in windows:
        check_lengths(engine, tokenizer, window, first_line)
        finished, written = {}, 0
        done = translations(engine, tokenizer, window, max_tokens, num_beams, alpha, nbest)
        for translation in itertools.chain(done, [None]):  # None: the window is translated
            if translation is not None:
                finished[translation.index] = translation.hypotheses
            ready = written
            while ready < len(window) and (ready in finished or not window[ready].strip()):
                ready += 1
            text = "".join(output_lines(window[i], finished.pop(i, None), first_line - 1 + i, nbest)
                           for i in range(written, ready))
            yield text, ready - written, translation.tokens if translation is not None else 0
            written = ready


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vaswani-translate", description="Translate lines of text (§6.1 decoding).")
    parser.add_argument("--model", required=True, help="A model folder or Hub repository id.")
    parser.add_argument("--input", help="A text file, one source per line, or its .gz, .bz2, .xz (default: stdin).")
    parser.add_argument("--output", help="Where the translations go (default: stdout): a new file unless "
                        "--overwrite, written as OUTPUT.partial and renamed when every line is translated.")
    parser.add_argument("--overwrite", action="store_true",
                        help="Replace an existing --output file (and start over a stopped run's OUTPUT.partial).")
    parser.add_argument("--resume", action="store_true",
                        help="Continue the OUTPUT.partial file that a stopped or killed run of the same input and "
                        "flags left: its translations are kept and the lines after them translated.")
    parser.add_argument("--max_tokens", type=int, default=MAX_TOKENS,
                        help=f"Source tokens per batch, padding included (default {MAX_TOKENS}).")
    parser.add_argument("--num_beams", type=int, help="Beam size (default: the model's generation config, else 4).")
    parser.add_argument("--alpha", type=float,
                        help="GNMT length penalty α (default: the model's gnmt_alpha, else 0.6; a converted model "
                             "decodes as published unless this is given).")
    parser.add_argument("--extra_length", type=int,
                        help="Tokens an output may run past its source's length (default: the model's extra_length, "
                             "else the paper's 50; its parser's: 300).")
    parser.add_argument("--window", type=int, default=WINDOW,
                        help=f"Lines read, sorted by length and batched together (default {WINDOW}).")
    parser.add_argument("--nbest", type=int, default=1,
                        help="Hypotheses per line, as 'line ||| translation ||| score' (at most the beam size).")
    parser.add_argument("--device", default="auto", help="cpu, cuda, cuda:1, ... (default: a GPU if there is one).")
    parser.add_argument("--int8", action="store_true", help="Int8 linear layers on the CPU (faster; a deviation).")
    parser.add_argument("--engine", choices=("torch", "ctranslate2"), default="torch",
                        help="torch: the model and the paper's search (default); ctranslate2: the model's CTranslate2 "
                        "export, converted once into a cache ($VASWANI_HF_CACHE, else ~/.cache/vaswani_hf) and faster "
                        "on some CPUs; its beam search divides log P by |Y|^alpha, not by the paper's GNMT penalty "
                        "(greedy decoding is the same).")
    parser.add_argument("--no_fast_cpu", action="store_true",
                        help="On a CPU, decode as the model files are written, not with what whole calls were "
                        "measured faster with on this machine (vaswani_hf.fast_cpu).")
    parser.add_argument("--quiet", action="store_true", help="No progress bar on stderr.")
    args = parser.parse_args(argv)
    for name, value in (("max_tokens", args.max_tokens), ("window", args.window), ("num_beams", args.num_beams),
                        ("nbest", args.nbest)):
        if value is not None and value < 1:  # num_beams None: the model's
            raise SystemExit(f"error: --{name} {value}: must be at least 1")
    if args.alpha is not None and not 0 <= args.alpha < math.inf:
        raise SystemExit(f"error: --alpha {args.alpha}: must be finite and at least 0")  # as training/run.py's
    if args.extra_length is not None and args.extra_length < 0:
        raise SystemExit(f"error: --extra_length {args.extra_length}: must be at least 0")
    for name, default in (("input", "standard input"), ("output", "standard output")):
        if (value := getattr(args, name)) is not None and not value.strip():  # an unset shell variable
            raise SystemExit(f"error: --{name} is blank: give a file, or leave the flag out for {default}")
    if args.input and not Path(args.input).is_file():
        raise SystemExit(f"error: --input {args.input}: no such file")
    if args.output and (Path(args.output).is_dir() or not Path(args.output).resolve().parent.is_dir()):
        raise SystemExit(f"error: --output {args.output}: not a file in an existing folder")
    if args.output and not os.access(folder := Path(args.output).resolve().parent, os.W_OK | os.X_OK):
        raise SystemExit(f"error: --output {args.output}: {folder} is not writable")  # as vaswani-export's
    if args.output and Path(args.output).exists() and not args.overwrite:
        raise SystemExit(f"error: --output {args.output} exists: give --overwrite to replace it")
    if args.resume and not args.output:
        raise SystemExit("error: --resume continues the OUTPUT.partial file of an --output: give the --output")
    # Written beside --output and renamed at the end: a run that fails or is killed leaves an earlier file whole, and
    # what it translated in OUTPUT.partial, which --resume continues.
    partial = f"{args.output}.partial" if args.output else None
    if partial and Path(partial).exists() and not (args.resume or args.overwrite):
        raise SystemExit(f"error: {partial} holds an earlier run's translations: give --resume to continue a stopped "
                         "run, or --overwrite to start again")
    done, kept = translated_part(partial, args.nbest) if partial and args.resume and Path(partial).exists() else (0, 0)

    typed = not args.input and sys.stdin.isatty()  # lines typed at a terminal: each translated when entered
    total = counted_lines(args.input) if args.input else None  # a file that is not UTF-8 stops before the model loads
    with contextlib.ExitStack() as files:
        stream = files.enter_context(opened(args.input)) if args.input else sys.stdin.buffer
        name = args.input or "the standard input"
        windows = read_windows(skipped(stream, done, name, partial), name, 1 if typed else args.window, done + 1)
        first = next(windows, (done + 1, []))  # read before the model loads: a window that is not UTF-8 stops here
        keep_freed_memory()  # the decoding steps reuse the (beams x vocabulary) blocks they free (allocator.py)
        disable_progress_bar()  # transformers' bars; ours counts lines
        engine, tokenizer = load_engine(args.model, args.engine, args.device, args.int8, fast=not args.no_fast_cpu)
        num_beams = args.num_beams or getattr(engine.generation_config, "num_beams", None) or 4
        if args.extra_length is not None:
            if args.alpha is None and not papers_decoding(engine.generation_config):
                raise SystemExit(f"error: --extra_length limits the paper's search, and {args.model} decodes as it "
                                 "was published: give --alpha too")
            engine.generation_config.extra_length = args.extra_length
        if args.nbest > num_beams:
            raise SystemExit(f"error: --nbest {args.nbest} is more than the beam size {num_beams}")
        if args.input and engine.positions is not None:  # a file's every line, before any is decoded
            with opened(args.input) as file:
                rest = skipped(file, done, name, partial)
                for first_line, window in read_windows(rest, name, args.window, done + 1):
                    check_lengths(engine, tokenizer, window, first_line)
        else:  # a stream's first window before the progress bar draws itself, the others as they are read
            check_lengths(engine, tokenizer, first[1], first[0])
        if partial and done:
            os.truncate(partial, kept)  # a line a kill cut short goes
        try:  # a new OUTPUT.partial is made only if none is there: another run may have made one since the check
            mode = "a" if done else "w" if args.overwrite or args.resume else "x"
            output = files.enter_context(open(partial, mode, encoding="utf-8")) if partial else sys.stdout
        except FileExistsError:
            raise SystemExit(f"error: {partial} was made by another run of this --output while this one loaded its "
                             "model: let that one finish, or give --overwrite") from None
        progress = files.enter_context(tqdm(total=total, initial=done, unit=" lines", file=sys.stderr,
                                            disable=args.quiet or typed, desc=engine.name))
        start, tokens = time.perf_counter(), 0
        try:
            for text, lines, new_tokens in translated_windows(engine, tokenizer, itertools.chain([first], windows),
                                                              args.max_tokens, num_beams, args.alpha, args.nbest):
                output.write(text)
                output.flush()
                tokens += new_tokens
                progress.set_postfix_str(f"{tokens / (time.perf_counter() - start):.0f} tokens/s", refresh=False)
                progress.update(lines)
        except KeyboardInterrupt:  # Ctrl-C: the lines written are whole (a line a stop cuts short, --resume drops)
            progress.close()
            if partial:
                print(f"stopped: {partial} keeps the translations written; the same command with --resume goes on",
                      file=sys.stderr)
            raise SystemExit(128 + signal.SIGINT) from None
        except BrokenPipeError:  # the reader stopped reading (`| head`): nothing to say, nothing more to write
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # Python's flush at exit would fail again
            raise SystemExit(1) from None
        except OSError as error:  # a full disk: the lines written are kept, for --resume
            if not partial or not refused_write(error):
                raise
            raise SystemExit(f"error: {partial}: {error.strerror}: its translations are kept; make room, then add "
                             "--resume") from None
        if args.output:
            output.close()
            os.replace(partial, args.output)


if __name__ == "__main__":
    main()
