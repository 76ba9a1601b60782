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
    vaswani-translate --model outputs/run --input sources.txt --score translations.txt   # log P of each, perplexity

On a CPU the float32 model is transformed by `vaswani_hf.fast_cpu` (what whole calls were measured faster with, on
this machine, once); `--no_fast_cpu` decodes as the model files are written. `--engine ctranslate2` decodes with the
model's CTranslate2 export instead (ctranslate2_engine.py's `CTranslate2Engine`, converted once into a cache): the same
greedy tokens, its own beam search (log P / |Y|^α). `--score` decodes nothing: it writes the log-probability of each
given translation (`score`), the model reading it whole, and the perplexity per token of them all (Table 3's PPL).
On a CPU the command threads over at most the cores it may use (`usable_cores`: a container's CPU limit included),
unless OMP_NUM_THREADS is set. In Python, `load_engine` gives either engine, `translate` or `translations` decode
with it, `score` scores with it:

    engine, tokenizer = load_engine("outputs/run", "ctranslate2")
    translate(engine, tokenizer, ["A man is riding a bike."])
    score(engine, tokenizer, ["A man is riding a bike."], ["Ein Mann fährt Fahrrad."])[0].log_prob
"""

import argparse
import codecs
import contextlib
import itertools
import math
import os
import signal
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch
from tqdm.auto import tqdm
from transformers.utils.logging import disable_progress_bar

from ..gnmt import (
    check_alpha,
    check_beam_processors,
    check_whole,
    extra_length_of,
    gnmt_beam_search,
    gnmt_length_penalty,
    logits_processors,
    output_limits,
    right_padded,
    stopping_criteria_of,
)
from ..speed.allocator import keep_freed_memory
from ..speed.kernels import usable_cores
from .loading import (
    PAPERS_ALPHA,
    PAPERS_BEAMS,
    check_gpu,
    checked,
    device_kind,
    learned_positions,
    load,
    one_line_errors,
    papers_decoding,
)
from .text import DAMAGED, decode_utf8, opened, refused_write, split_lines, utf8_output

MAX_TOKENS = 4096  # source tokens per batch, padding included
WINDOW = 2000  # lines read, sorted by length and batched together


def load_engine(name_or_path: str, engine: str = "torch", device: str = "auto", int8: bool = False,
                fast: bool = True, scoring: bool = False):
    """(engine, tokenizer): the torch model (`load`, `TorchEngine`) or its CTranslate2 export (ctranslate2_engine.py's
    `CTranslate2Engine`) on `device` (auto: a GPU if the engine finds one), int8 with `int8`; `scoring`: to score
    alone (no logits processor is refused)."""
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
        return CTranslate2Engine(name_or_path, config, tokenizer, device, int8, scoring=scoring), tokenizer


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
    num_beams = num_beams if num_beams is not None else getattr(config, "num_beams", None) or PAPERS_BEAMS
    check_request(sources, num_beams, max_tokens, nbest, alpha)
    if alpha is None and papers_decoding(config):
        alpha = getattr(config, "gnmt_alpha", PAPERS_ALPHA)
    indices = [i for i, source in enumerate(sources) if source.strip()]
    encoded = tokenizer([sources[i] for i in indices])["input_ids"] if indices else []
    check_positions(engine, encoded, "a source")
    for batch in token_batches([len(ids) for ids in encoded], max_tokens):
        hypotheses, scores = engine.decode([encoded[j] for j in batch], num_beams, alpha, nbest)
        texts = tokenizer.batch_decode(hypotheses, skip_special_tokens=True)
        for k, j in enumerate(batch):
            rows = slice(k * nbest, (k + 1) * nbest)
            yield Translation(indices[j], list(zip(texts[rows], scores[rows])), len(hypotheses[k * nbest]))


class Score(NamedTuple):
    index: int  # of the pair
    log_prob: float  # log P(Y|X) of the target given its source, natural log, EOS included
    tokens: int  # of the target, EOS included


def scored(model, tokenizer, sources: list[str], targets: list[str],
           max_tokens: int = MAX_TOKENS) -> Iterator[Score]:
    """Each target's log-probability given its source under the model, read whole at once as in training (teacher
    forcing), batch by batch (`token_batches` by each pair's longer side), yielded as its batch finishes. Both are
    tokenized as training tokenizes them (`tokenizer(sources)`, `tokenizer(text_target=targets)`); no logits processor
    applies: the model's own distribution, over every token. `model`: a torch model, or an engine that scores token
    batches (`TorchEngine`, ctranslate2_engine.py's `CTranslate2Engine`, onnx_runtime.py's `OnnxSeq2Seq`). A source or
    target longer than the engine's `positions` (learned ones) is a one-line ValueError before any batch is scored."""
    engine = as_engine(model, tokenizer)
    check_whole("max_tokens", max_tokens, 1)
    check_texts("sources", sources)
    check_texts("targets", targets)
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} sources and {len(targets)} targets: give one target per source")
    source_ids = tokenizer(list(sources))["input_ids"] if sources else []
    target_ids = tokenizer(text_target=list(targets))["input_ids"] if targets else []
    check_positions(engine, source_ids + target_ids, "a source or target")
    lengths = [max(len(source), len(target)) for source, target in zip(source_ids, target_ids)]
    for batch in token_batches(lengths, max_tokens):
        log_probs = engine.score([source_ids[j] for j in batch], [target_ids[j] for j in batch])
        yield from (Score(j, log_prob, len(target_ids[j])) for j, log_prob in zip(batch, log_probs))


def score(model, tokenizer, sources: list[str], targets: list[str], max_tokens: int = MAX_TOKENS) -> list[Score]:
    """`scored`, in the pairs' order."""
    return sorted(scored(model, tokenizer, sources, targets, max_tokens))


def check_request(sources, num_beams: int, max_tokens: int, nbest: int = 1, alpha: float | None = None) -> None:
    """One line for what a translation cannot take, before anything is decoded: a beam size or `max_tokens` that is
    not a whole number of at least 1, `nbest` hypotheses outside 1 to the beam size, an α that is not a finite number
    of at least 0 (ValueError); `sources` that are not a list (or tuple) of strings (`check_texts`)."""
    if alpha is not None:
        check_alpha("alpha", alpha)
    check_whole("num_beams", num_beams, 1)
    check_whole("max_tokens", max_tokens, 1)
    check_whole("nbest", nbest, 1)
    if nbest > num_beams:
        raise ValueError(f"nbest must be at most num_beams={num_beams}, got {nbest}")
    check_texts("sources", sources)


def check_positions(engine, encoded: list[list[int]], what: str) -> None:
    """A one-line ValueError where a sequence of token ids is longer than the engine's `positions` (learned ones)."""
    positions, longest = getattr(engine, "positions", None), max(map(len, encoded), default=0)
    if positions is not None and longest > positions:
        raise ValueError(f"{what} has {longest} tokens; this model's positions stop at {positions}")


def check_texts(name: str, texts) -> None:
    """A TypeError in one line unless `texts` is a list (or tuple) of strings: a lone string would be read a character
    at a time."""
    if not isinstance(texts, (list, tuple)):
        raise TypeError(f"{name}: a list of strings, got {type(texts).__name__}")
    others = [type(text).__name__ for text in texts if not isinstance(text, str)]
    if others:
        raise TypeError(f"{name}: a list of strings, got a list holding {others[0]}")


def as_engine(model, tokenizer):
    """`model` as an engine: a torch model in a `TorchEngine`, an engine as it is."""
    return TorchEngine(model, tokenizer) if isinstance(model, torch.nn.Module) else model


class TorchEngine:
    """Decodes batches of token ids with the torch model: the paper's search, or transformers' `generate()` (`search`).
    `decode` returns each source's `nbest` hypotheses (ids after the start token, EOS included where one ended it),
    best first, and their scores; `score`, each target's log P given its source. `positions`: the most tokens a source
    may have (learned positions), None for any."""

    name = "torch"

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer
        self.config, self.generation_config = model.config, model.generation_config
        self.positions = learned_positions(model.config)

    @torch.no_grad()
    def decode(self, batch: list[list[int]], num_beams: int, alpha: float | None,
               nbest: int) -> tuple[list[list[int]], list[float]]:
        fast = getattr(self.model, "fast_decoding", lambda beams: contextlib.nullcontext())  # fast_cpu's
        with evaluating(self.model) as device, fast(num_beams):
            return decoded_batch(self.model, self.tokenizer, batch, num_beams, alpha, nbest, device)

    @torch.no_grad()
    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[float]:
        """Each target's log P given its source (token ids, as `scored` makes them), the model reading it whole."""
        with evaluating(self.model) as device:
            source, mask, labels = scoring_batch(self.tokenizer, sources, targets, device)
            logits = self.model(input_ids=source, attention_mask=mask,
                                decoder_input_ids=self.model.prepare_decoder_input_ids_from_labels(labels)).logits
            return log_p(logits, labels)


def scoring_batch(tokenizer, sources: list[list[int]], targets: list[list[int]],
                  device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """An engine's `score` inputs: the sources padded (on the right, as the search reads them) and their mask, and the
    targets as labels, -100 after each."""
    inputs = tokenizer.pad({"input_ids": sources}, return_tensors="pt").to(device)
    labels = torch.nn.utils.rnn.pad_sequence([torch.tensor(ids) for ids in targets], batch_first=True,
                                             padding_value=-100)
    return *right_padded(inputs["input_ids"], inputs["attention_mask"]), labels.to(device)


def log_p(logits: torch.Tensor, labels: torch.Tensor) -> list[float]:
    """Each row's log-probability of its labels (-100: none) under the logits, (B, T, V)."""
    nll = torch.nn.functional.cross_entropy(logits.float().transpose(1, 2), labels, reduction="none")
    return nll.sum(-1).neg().tolist()


@contextlib.contextmanager
def evaluating(model):
    """`model` in eval mode, its device given; the caller's mode back after (a training loop goes on training)."""
    training = model.training
    model.eval()
    try:
        yield next(model.parameters()).device
    finally:
        model.train(training)


def decoded_batch(model, tokenizer, batch: list[list[int]], num_beams: int, alpha: float | None, nbest: int,
                  device: torch.device | str = "cpu") -> tuple[list[list[int]], list[float]]:
    """An engine's `decode` by `search`: each source's `nbest` hypotheses (ids after the start token, no padding),
    best first, and their scores."""
    inputs = tokenizer.pad({"input_ids": batch}, return_tensors="pt").to(device)
    sequences, scores = search(model, tokenizer, inputs, num_beams, alpha, nbest)
    pad = tokenizer.pad_token_id
    return [[i for i in row if i != pad] for row in sequences[:, 1:].tolist()], scores.tolist()


def search(model, tokenizer, inputs, num_beams: int, alpha: float | None,
           nbest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The `nbest` best hypotheses of each row and their scores: the paper's search with GNMT α (log P / penalty),
    with the logits processors the generation config asks for (an OPUS-MT model's banned <pad> and forced EOS) and
    its `stop_strings` (read with `tokenizer`), or, without α, transformers' `generate()` with the model's generation
    config (log P, divided by |Y|^length_penalty in beam search)."""
    if alpha is not None:
        config, source, mask = model.generation_config, inputs["input_ids"], inputs["attention_mask"]
        limits = output_limits(model.config, mask, None, extra_length_of(config))
        return gnmt_beam_search(model, source, mask, num_beams, alpha, extra_length=extra_length_of(config),
                                num_return_sequences=nbest, output_scores=True,
                                logits_processor=logits_processors(model, config, source, {}, num_beams, limits),
                                stopping_criteria=stopping_criteria_of(model, config, {"tokenizer": tokenizer}))
    found = model.generate(**inputs, num_beams=num_beams, num_return_sequences=nbest, output_scores=True,
                           return_dict_in_generate=True, tokenizer=tokenizer)
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


def check_lengths(engine, tokenizer, lines: list[str] | list[tuple[str, str]], first_line: int = 1) -> None:
    """A source longer than the engine's model has positions for (`engine.positions`: learned ones, a table) is a
    one-line error before it is decoded; of (source, translation) pairs (--score), either side."""
    if engine.positions is None or not lines:
        return
    sides = {"": tokenizer(list(lines))} if isinstance(lines[0], str) else {
        "'s source": tokenizer([source for source, _ in lines]),
        "'s translation": tokenizer(text_target=[target for _, target in lines])}
    for side, encoded in sides.items():
        for number, ids in enumerate(encoded["input_ids"], first_line):
            if len(ids) > engine.positions:
                raise SystemExit(f"error: line {number}{side} has {len(ids)} tokens; this model's positions stop at "
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
    except (OSError, *DAMAGED) as error:
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


class Written(NamedTuple):
    text: str  # to write
    lines: int  # the input lines it answers
    tokens: int  # translated, or scored (the targets')
    log_prob: float = 0.0  # of the targets scored


def translated_windows(engine, tokenizer, windows: Iterable[tuple[int, list[str]]], max_tokens: int, num_beams: int,
                       alpha: float | None, nbest: int) -> Iterator[Written]:
    """What to write as batches finish, in input order. `engine`: as `translations` takes it."""
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
            yield Written(text, ready - written, translation.tokens if translation is not None else 0)
            written = ready


def scored_windows(engine, tokenizer, windows: Iterable[tuple[int, list[tuple[str, str]]]], max_tokens: int,
                   alpha: float | None, normalize: bool) -> Iterator[Written]:
    """--score: a line for each (source, translation) pair, its log P(Y|X) (`scored`), divided by the GNMT penalty
    lp(|Y|) with `alpha` (as the search ranks hypotheses, as --nbest prints them), or with `normalize` by |Y|; written
    in input order as batches finish. `engine`: as `scored` takes it."""
    engine = as_engine(engine, tokenizer)
    for first_line, window in windows:
        check_lengths(engine, tokenizer, window, first_line)
        finished, written = {}, 0
        for result in scored(engine, tokenizer, [source for source, _ in window], [target for _, target in window],
                             max_tokens):
            finished[result.index] = result
            ready = []
            while written + len(ready) in finished:
                ready.append(finished.pop(written + len(ready)))
            divisors = [gnmt_length_penalty(pair.tokens, alpha) if alpha is not None else pair.tokens if normalize
                        else 1 for pair in ready]
            yield Written("".join(f"{pair.log_prob / divisor:.4f}\n" for pair, divisor in zip(ready, divisors)),
                          len(ready), sum(pair.tokens for pair in ready), sum(pair.log_prob for pair in ready))
            written += len(ready)


def paired(windows: Iterator[tuple[int, list[str]]], translations: Iterator[tuple[int, list[str]]], name: str,
           translations_name: str) -> Iterator[tuple[int, list[tuple[str, str]]]]:
    """Windows of (source, translation) pairs from two files' windows of the same size; files of different lengths
    stop the program in one line where the shorter ends."""
    for (first_line, sources), (other_first, targets) in itertools.zip_longest(windows, translations,
                                                                                fillvalue=(0, [])):
        if len(sources) != len(targets):
            end = max(first_line, other_first) + min(len(sources), len(targets)) - 1
            raise SystemExit(f"error: {name} and --score {translations_name} differ in length, one ending at line "
                             f"{end}: give a translation per line")
        yield first_line, list(zip(sources, targets))


def main(argv: list[str] | None = None) -> None:
    utf8_output()
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
                        "on some CPUs; its beam search divides log P by |Y|^alpha, not by the paper's GNMT penalty, "
                        "and ends a sentence once as many hypotheses as beams have ended, where the paper's search "
                        "goes on while one alive can still win (greedy decoding is the same).")
    parser.add_argument("--no_fast_cpu", action="store_true",
                        help="On a CPU, decode as the model files are written, not with what whole calls were "
                        "measured faster with on this machine (vaswani_hf.fast_cpu).")
    parser.add_argument("--quiet", action="store_true", help="No progress bar on stderr.")
    parser.add_argument("--score", metavar="TRANSLATIONS",
                        help="Score this file's lines, translations of the input's, instead of translating: a line "
                        "each, log P(translation | source) (natural log, EOS included; divided by the GNMT penalty "
                        "with --alpha, as --nbest's scores), and the perplexity per token on stderr.")
    parser.add_argument("--normalize", action="store_true", help="--score: log P divided by the translation's tokens.")
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
    check_scoring(args)
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
    name = args.input or "the standard input"
    if args.score and total is not None and total != (given := counted_lines(args.score)):
        raise SystemExit(f"error: --input {args.input} has {total} lines, --score {args.score} {given}: give a "
                         "translation per line")

    def windows_after_done(files: contextlib.ExitStack, size: int):
        """The input's lines after those done, `size` at a time; with --score, (source, translation) pairs."""
        stream = files.enter_context(opened(args.input)) if args.input else sys.stdin.buffer
        windows = read_windows(skipped(stream, done, name, partial), name, size, done + 1)
        if not args.score:
            return windows
        translations = skipped(files.enter_context(opened(args.score)), done, args.score, partial)
        return paired(windows, read_windows(translations, args.score, size, done + 1), name, args.score)

    with contextlib.ExitStack() as files:
        windows = windows_after_done(files, 1 if typed else args.window)
        first = next(windows, (done + 1, []))  # read before the model loads: a window that is not UTF-8 stops here
        keep_freed_memory()  # the decoding steps reuse the (beams x vocabulary) blocks they free (allocator.py)
        disable_progress_bar()  # transformers' bars; ours counts lines
        if "OMP_NUM_THREADS" not in os.environ:  # torch's threads, which a container's CPU limit does not bound
            torch.set_num_threads(min(torch.get_num_threads(), usable_cores()))
        engine, tokenizer = load_engine(args.model, args.engine, args.device, args.int8, fast=not args.no_fast_cpu,
                                        scoring=bool(args.score))
        num_beams = args.num_beams or getattr(engine.generation_config, "num_beams", None) or PAPERS_BEAMS
        if args.extra_length is not None:
            if args.alpha is None and not papers_decoding(engine.generation_config):
                raise SystemExit(f"error: --extra_length limits the paper's search, and {args.model} decodes as it "
                                 "was published: give --alpha too")
            engine.generation_config.extra_length = args.extra_length
        if args.nbest > num_beams:
            raise SystemExit(f"error: --nbest {args.nbest} is more than the beam size {num_beams}")
        if args.alpha is not None or papers_decoding(engine.generation_config):  # the paper's search, before work
            try:
                check_beam_processors(engine.generation_config, num_beams)
            except ValueError as error:
                raise SystemExit(f"error: {args.model}'s generation config: {error}") from None
        if args.input and engine.positions is not None:  # a file's every line, before any is decoded
            with contextlib.ExitStack() as again:
                for first_line, window in windows_after_done(again, args.window):
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
        start, tokens, log_prob, lines_done = time.perf_counter(), 0, 0.0, 0
        windows = itertools.chain([first], windows)
        written = (scored_windows(engine, tokenizer, windows, args.max_tokens, args.alpha, args.normalize)
                   if args.score else
                   translated_windows(engine, tokenizer, windows, args.max_tokens, num_beams, args.alpha, args.nbest))
        try:
            for text, lines, new_tokens, new_log_prob in written:
                output.write(text)
                output.flush()
                tokens, log_prob, lines_done = tokens + new_tokens, log_prob + new_log_prob, lines_done + lines
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
    if args.score and tokens:
        print(f"perplexity {math.exp(-log_prob / tokens):.4f} over the {tokens:,} tokens (EOS included) of the "
              f"{lines_done:,} translation{'s' * (lines_done != 1)} scored", file=sys.stderr)


def check_scoring(args) -> None:
    """--score's flags, in one line each: its file there, none of the decoding's flags, one divisor of the scores."""
    if args.score is None:
        if args.normalize:
            raise SystemExit("error: --normalize divides --score's scores: give --score TRANSLATIONS")
        return
    if not Path(args.score).is_file():
        raise SystemExit(f"error: --score {args.score}: no such file")
    decoding = [flag for flag, given in (("--num_beams", args.num_beams is not None), ("--nbest", args.nbest != 1),
                                         ("--extra_length", args.extra_length is not None)) if given]
    if decoding:
        raise SystemExit(f"error: {', '.join(decoding)}: --score scores the translations given, it decodes nothing")
    if args.normalize and args.alpha is not None:
        raise SystemExit("error: --normalize and --alpha both divide the scores: give one")


if __name__ == "__main__":
    main()
