"""`vaswani-translate --engine ctranslate2`: decoding with the model's CTranslate2 export (exports/to_ctranslate2.py),
converted the first time and kept in a cache keyed by what it is made from, with CTranslate2's workers and threads
measured once per export and CPU."""

import functools
import hashlib
import math
import shutil
import time
from pathlib import Path

import ctranslate2
import torch
from filelock import FileLock
from transformers.utils import cached_file
from transformers.utils.hub import get_checkpoint_shard_files

from ..exports import to_ctranslate2
from ..gnmt import PROCESSOR_SETTINGS, STOPPING_SETTINGS, extra_length_of
from ..speed.fast_cpu import chosen, round_seconds, rule
from ..speed.kernels import cache_root, cpu_name, kept, writable
from .export import written_whole
from .hub import TOKENIZER_FILES
from .loading import learned_positions, load


def kept_workers(folder: Path, compute: str, threads: int, tokenizer,
                 positions: int = to_ctranslate2.POSITIONS) -> dict:
    """CTranslate2's workers for this export on this CPU, {"inter_threads": batches decoded at once, "intra_threads":
    threads each}: one batch on `threads` threads; else one on one thread, or `threads` parts of the batch at once
    on one thread each, where greedy translations of a probe (16 random sources of 24 tokens, 16 tokens each, fewer
    where the export has fewer `positions`; fast_cpu's interleaved rounds) took at most `fast_cpu.MARGIN` of the time
    of the one chosen before it, as `fast_cpu.chosen` judges. Measured once and kept beside the export; what each
    candidate gained on which CPU is in benchmarks/README.md. Leaves torch's thread count at `threads`."""
    candidates = [{"inter_threads": 1, "intra_threads": threads}, {"inter_threads": 1, "intra_threads": 1},
                  {"inter_threads": threads, "intra_threads": 1}]

    def measure() -> dict:
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(4, len(tokenizer), (16, min(24, positions)), generator=generator).tolist()
        sources = [tokenizer.convert_ids_to_tokens(row) for row in ids]
        translators = [ctranslate2.Translator(str(folder), device="cpu", compute_type=compute, **workers)
                       for workers in candidates]
        torch.set_num_threads(threads)  # each Translator set OpenMP's, which torch shares
        rounds = round_seconds([functools.partial(probe_seconds, translator, sources, workers["inter_threads"],
                                                  min(16, positions))
                                for translator, workers in zip(translators, candidates)])
        return {"workers": candidates[chosen(rounds)], "seconds": [min(times) for times in rounds]}

    facts = {"cpu": cpu_name(), "compute": compute, "threads": threads, "candidates": candidates, "rule": rule()}
    return kept(folder / "threads", facts, "workers", measure)


def probe_seconds(translator, sources: list[list[str]], parts: int, tokens: int) -> float:
    """Seconds of one greedy translation of `sources`, `tokens` tokens each, in `parts` batches at once."""
    start = time.perf_counter()
    translator.translate_batch(sources, beam_size=1, min_decoding_length=tokens, max_decoding_length=tokens,
                               max_batch_size=math.ceil(len(sources) / parts))
    return time.perf_counter() - start


def cached_export(name_or_path: str, quantization: str) -> Path:
    """The model's CTranslate2 export in `quantization`, converted the first time and kept in
    `cache_root("ctranslate2")` under a key of what it is made from: the bytes of its weights (`weight_files`),
    configuration and tokenizer (ours, or a converted model's: `TOKENIZER_FILES`), the quantization, this converter's
    own code and CTranslate2's version. A folder whose weights change gets a new export; processes that need the
    same export at once convert it once."""
    key = hashlib.sha256(f"{quantization} {ctranslate2.__version__}".encode())
    key.update(Path(to_ctranslate2.__file__).read_bytes())  # the converter's code
    tokenizer = [cached_file(name_or_path, name, _raise_exceptions_for_missing_entries=False)
                 for names in TOKENIZER_FILES.values() for name in names]
    for path in [cached_file(name_or_path, "config.json"), *filter(None, tokenizer), *weight_files(name_or_path)]:
        with open(path, "rb") as file:
            for block in iter(lambda: file.read(1 << 24), b""):
                key.update(block)
    folder = cache_root("ctranslate2") / key.hexdigest()[:32]
    if not (folder / "model.bin").is_file():
        # One process converts at a time; another that needs the same export waits, then reads it.
        with FileLock(writable(folder.parent) / "converting.lock"):  # writable: before the conversion
            if not (folder / "model.bin").is_file():
                shutil.rmtree(folder, ignore_errors=True)  # a damaged export (its model.bin lost) is made again
                model, tokenizer = load(name_or_path, device="cpu", fast=False)
                with written_whole(folder) as partial:
                    to_ctranslate2.export(model, tokenizer, partial, quantization=quantization)
    return folder


def weight_files(name_or_path: str) -> list[str]:
    """The model's weights: model.safetensors, or the shards' index and the shards it names (from the Hub if need
    be)."""
    whole = cached_file(name_or_path, "model.safetensors", _raise_exceptions_for_missing_entries=False)
    if whole is not None:
        return [whole]
    index = cached_file(name_or_path, "model.safetensors.index.json", _raise_exceptions_for_missing_entries=False)
    if index is None:
        raise OSError(f"{name_or_path} has no model.safetensors, nor model.safetensors.index.json for its shards")
    return [index, *get_checkpoint_shard_files(name_or_path, index)[0]]


# The generation config's processor settings the engine applies: CTranslate2's own options (`decode`).
APPLIED = ("bad_words_ids", "no_repeat_ngram_size", "repetition_penalty", "forced_eos_token_id")


class CTranslate2Engine:
    """Decodes batches of token ids with the model's CTranslate2 export (`cached_export`), as translate.py's
    `TorchEngine` does with the torch model: each source's `nbest` hypotheses (ids, EOS included where one ended
    it), best first, and CTranslate2's scores. Each output stops at its source's length + 50 tokens (§6.1; the
    generation config's `extra_length` where it has one), or at the export's last position (`positions`: the learned
    ones, else its table's rows; a longer source is refused before it is decoded: translate.py's `check_lengths`).

    Greedy decoding gives the torch model's tokens. Beam search ranks by log P / |Y|^α (CTranslate2's length penalty,
    with the model's α; without one, its generation config's `length_penalty`, else generate()'s 1), not by the paper's
    GNMT penalty, and a source ends once as many hypotheses as beams have ended (CTranslate2's `patience` 1), where the
    paper's search goes on while an alive one can still win: the beams can differ, and CTranslate2 computes fewer
    steps. The generation config's banned words (`bad_words_ids`: an OPUS-MT model's <pad>) are CTranslate2's
    suppressed sequences, its `no_repeat_ngram_size` and `repetition_penalty` CTranslate2's; a model whose generation
    config asks for another logits processor is refused, as CTranslate2 would decode without it; `forced_eos_token_id`
    (OPUS-MT's) is the last token of a hypothesis cut at its limit (greedy: the torch engine's tokens). `score` gives
    each target's log P given its source (CTranslate2's `score_batch`; with `scoring`, an engine for that alone,
    another processor is not refused). `workers`: CTranslate2's (`kept_workers`' layout; by default measured on a CPU),
    each batch decoded or scored in a part for each worker."""

    name = "ctranslate2"

    def __init__(self, name_or_path: str, config, tokenizer, device: str = "cpu", int8: bool = False,
                 workers: dict | None = None, scoring: bool = False):
        from transformers import GenerationConfig

        self.config, self.tokenizer = config, tokenizer
        self.positions = learned_positions(config) or to_ctranslate2.POSITIONS  # rows of the export's table
        try:
            self.generation_config = GenerationConfig.from_pretrained(name_or_path)
        except OSError:  # no generation_config.json: the model config's tokens, as from_pretrained makes it
            self.generation_config = GenerationConfig.from_model_config(config)
        generation, defaults = self.generation_config, GenerationConfig._get_default_generation_params()
        unapplied = [f"{key}={getattr(generation, key)}" for key in (*PROCESSOR_SETTINGS, *STOPPING_SETTINGS)
                     if key not in APPLIED and getattr(generation, key) not in (None, False, defaults.get(key))]
        if unapplied and not scoring:  # scores take no processor
            raise ValueError(f"--engine ctranslate2 does not apply the generation config's {', '.join(unapplied)}: "
                             "decode with --engine torch")
        self.banned = [tokenizer.convert_ids_to_tokens(ids) for ids in generation.bad_words_ids or []]
        forced = generation.forced_eos_token_id
        self.forced_end = forced[0] if isinstance(forced, list) else forced
        folder = cached_export(name_or_path, "int8" if int8 else "float32")
        where = torch.device(device)
        compute = ("int8" if where.type == "cpu" else "int8_float16") if int8 else "float32"
        threads = torch.get_num_threads()  # CTranslate2 sets OpenMP's thread count: given torch's, it keeps it
        if workers is None:  # on a CPU, as measured for this export; else one batch at a time
            workers = (kept_workers(folder, compute, threads, tokenizer, self.positions)
                       if where.type == "cpu" and threads > 1 else {"inter_threads": 1, "intra_threads": threads})
        self.workers = workers
        self.translator = ctranslate2.Translator(str(folder), device=where.type, device_index=where.index or 0,
                                                 compute_type=compute, **self.workers)
        torch.set_num_threads(threads)

    def decode(self, batch: list[list[int]], num_beams: int, alpha: float | None,
               nbest: int) -> tuple[list[list[int]], list[float]]:
        generation = self.generation_config
        extra_length = extra_length_of(generation)
        limits = [min(len(ids) + extra_length, self.positions) for ids in batch]  # as gnmt.py's
        penalty = alpha if alpha is not None else generation.length_penalty
        if penalty is None:  # unset in the generation config: generate()'s default
            penalty = 1.0
        results = self.translator.translate_batch(
            [self.tokenizer.convert_ids_to_tokens(ids) for ids in batch], beam_size=num_beams, num_hypotheses=nbest,
            length_penalty=penalty, max_decoding_length=max(limits), min_decoding_length=1, return_scores=True,
            suppress_sequences=self.banned or None, no_repeat_ngram_size=generation.no_repeat_ngram_size or 0,
            repetition_penalty=generation.repetition_penalty or 1.0,
            return_end_token=True, max_input_length=0,
            max_batch_size=math.ceil(len(batch) / self.workers["inter_threads"]))  # a part for each worker
        hypotheses, scores = [], []
        for result, limit in zip(results, limits):
            for tokens, score in zip(result.hypotheses, result.scores):
                ids = self.tokenizer.convert_tokens_to_ids(tokens)[:limit]
                if self.forced_end is not None and len(ids) == limit and ids[-1] != self.config.eos_token_id:
                    ids[-1] = self.forced_end  # the search's forced end at the source's limit (gnmt.py's)
                hypotheses.append(ids)
                scores.append(score)
        return hypotheses, scores

    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[float]:
        """Each target's log P given its source (token ids, EOS last: CTranslate2 adds its own), as translate.py's
        `TorchEngine` scores them."""
        tokens = self.tokenizer.convert_ids_to_tokens
        results = self.translator.score_batch(
            [tokens(ids) for ids in sources], [tokens(ids[:-1]) for ids in targets], max_input_length=0,
            max_batch_size=math.ceil(len(sources) / self.workers["inter_threads"]))
        return [sum(result.log_probs) for result in results]
