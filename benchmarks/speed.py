"""Speed and memory of VaswaniForConditionalGeneration against transformers' MarianMTModel at identical sizes: the
model as its files are written ("plain": torch's and transformers' kernels, as Marian's) and as `vaswani_hf.fast_cpu`
transforms it ("ours": the decoding and training plan measured for this machine and size, in this process, as a first
call of `vaswani-translate` or `training/run.py` measures it).

Both models are built from random weights as the paper trains them (ReLU, shared embeddings scaled by
sqrt(d_model), static sinusoidal positions, post-LN, dropout 0.1) and timed on the same random batches,
interleaved in one process; CTranslate2 and ONNX Runtime run our model, exported by `vaswani-export`, when the
`export` extra is installed.

    python benchmarks/speed.py                   # both sizes, 2 threads
    python benchmarks/speed.py --sizes small --repeats 3
    python benchmarks/speed.py --keep-freed-memory  # glibc keeps freed memory for reuse (allocator.py), both models

Printed per size: medians of
  * training tokens/s: forward + backward + Adam step on 64 pairs of 32 source + 32 target tokens
    (tokens counted on both sides), the same cross-entropy on both models' logits;
  * greedy and beam-4 `generate()` tokens/s: 16 sources of 32 tokens, exactly 32 new tokens each (no EOS);
  * peak memory allocated by a training step above the weights and the optimizer state;
  * the same generation with our int8 copy (`vaswani_hf.quantize_int8` with its own `fast_cpu` plan, as
    `vaswani-translate --int8` decodes) against Marian in float32;
  * our model's greedy and beam-4 speed in CTranslate2, float32 and int8, and its greedy speed in ONNX Runtime
    (`vaswani-export onnx`, `OnnxSeq2Seq.greedy`), against ours in torch (the peer column then holds the engine);
and the ratio ours / peer; then the plans (`fast_cpu`'s, the int8 copy's) and the seconds of the calls they were
chosen by.
"""

import argparse
import atexit
import json
import math
import os
import shutil
import statistics
import tempfile
import time
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from transformers import MarianConfig, MarianMTModel

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, fast_cpu, keep_freed_memory, quantize_int8
from vaswani_hf.speed.kernels import cache_root, cpu_name
from vaswani_hf.speed.quantization import is_int8

SIZES = {
    "small": {"d_model": 256, "num_layers": 3, "num_heads": 4, "d_ff": 1024, "vocab_size": 8000},
    "base": {"d_model": 512, "num_layers": 6, "num_heads": 8, "d_ff": 2048, "vocab_size": 37000},
}
PAD, BOS, EOS = 0, 1, 2
TRAIN_BATCH, TRAIN_LENGTH = 64, 32
GENERATE_BATCH, SOURCE_LENGTH, NEW_TOKENS = 16, 32, 32


def build(name: str, size: dict, seed: int = 0, **options) -> nn.Module:
    torch.manual_seed(seed)
    if name == "ours":
        return VaswaniForConditionalGeneration(VaswaniConfig(**size, dropout=0.1, pad_token_id=PAD, bos_token_id=BOS,
                                                             eos_token_id=EOS, decoder_start_token_id=BOS, **options))
    config = MarianConfig(
        vocab_size=size["vocab_size"], decoder_vocab_size=size["vocab_size"], d_model=size["d_model"],
        encoder_layers=size["num_layers"], decoder_layers=size["num_layers"],
        encoder_attention_heads=size["num_heads"], decoder_attention_heads=size["num_heads"],
        encoder_ffn_dim=size["d_ff"], decoder_ffn_dim=size["d_ff"], activation_function="relu",
        scale_embedding=True, share_encoder_decoder_embeddings=True, max_position_embeddings=512,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0,
        pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=BOS, forced_eos_token_id=None,
    )
    return MarianMTModel(config)


def scratch_folder() -> str:
    """A new folder for what this process writes (exports, token files), removed when the process ends."""
    folder = tempfile.mkdtemp(prefix="vaswani-hf-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def seconds(function, repeats: int) -> float:
    """Median time of `repeats` calls after two warm-up calls."""
    function(), function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def random_tokens(batch: int, length: int, vocab_size: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(3, vocab_size, (batch, length), generator=generator)


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, source: torch.Tensor, target: torch.Tensor,
               autocast: torch.dtype | None = None) -> None:
    """Forward (under autocast to `autocast`, if given), the cross-entropy, backward and an Adam step. No decoding
    cache is built, as each trains: Seq2SeqTrainer's labels turn Marian's off, and training/run.py asks for none."""
    decoder_input_ids = torch.cat([torch.full_like(target[:, :1], BOS), target[:, :-1]], dim=1)
    with torch.autocast(source.device.type, dtype=autocast, enabled=autocast is not None):
        logits = model(input_ids=source, attention_mask=torch.ones_like(source),
                       decoder_input_ids=decoder_input_ids, use_cache=False).logits
        loss = nn.functional.cross_entropy(logits.flatten(0, 1).float(), target.flatten())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def paper_adam(model: nn.Module) -> torch.optim.Optimizer:
    """Fused, for both models, as each trains by default: training/run.py, and Seq2SeqTrainer (adamw_torch_fused)."""
    return torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, fused=True)


@torch.no_grad()
def generate(model: nn.Module, source: torch.Tensor, num_beams: int, new_tokens: int = NEW_TOKENS) -> None:
    """Exactly `new_tokens` tokens: no end of sentence. (`min_new_tokens` would add a logits processor whose
    torch.where over beams x vocabulary costs about a fifth of a base-size int8 beam-4 call, in both models.) The
    settings are arguments of generate(), not a GenerationConfig: generate() fills a config's None (eos_token_id
    among them) from the model's generation config, but takes an argument's as given."""
    output = model.generate(input_ids=source, attention_mask=torch.ones_like(source), num_beams=num_beams,
                            do_sample=False, max_new_tokens=new_tokens,
                            early_stopping=num_beams > 1,  # beam search's flag: greedy would warn of it
                            length_penalty=1.0, eos_token_id=None, pad_token_id=PAD, bos_token_id=BOS,
                            decoder_start_token_id=BOS)
    assert output.shape[1] == new_tokens + 1, output.shape


def peak_memory(run) -> float:
    """MiB: the high-water mark of the CPU memory allocated by `run()` above what was allocated before it (weights
    and Adam state, for a training step), from the allocation events of torch's profiler (also where a GPU is: every
    model here runs on the CPU)."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        run()
    events = sorted((e for e in profiler.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    in_use = peak = 0
    for event in events:
        in_use += event.nbytes()
        peak = max(peak, in_use)
    return peak / 2**20


class IdTokens:
    """No tokenizer: the ids' strings are the tokens (what the converter and `kept_workers` read of one)."""

    bos_token, eos_token, unk_token = str(BOS), str(EOS), "3"

    def __init__(self, size: int):
        self.vocab = {str(i): i for i in range(size)}

    def __len__(self) -> int:
        return len(self.vocab)

    def get_vocab(self) -> dict:
        return self.vocab

    def convert_ids_to_tokens(self, ids):
        return str(ids) if isinstance(ids, int) else [str(i) for i in ids]


def ctranslate2_translators(model: VaswaniForConditionalGeneration, threads: int) -> dict:
    """Our model exported as `vaswani-export ctranslate2` exports it, float32 and int8 (7-bit weights), each
    loaded in CTranslate2 with its own compute type and the workers `--engine ctranslate2` measures for it:
    {compute type: (translator, workers)}; {} without the package."""
    try:
        import ctranslate2

        from vaswani_hf.exports.to_ctranslate2 import VaswaniConverter
        from vaswani_hf.tools.ctranslate2_engine import kept_workers
    except ImportError:
        return {}
    tokens = IdTokens(model.config.vocab_size)
    folder = scratch_folder()
    translators = {}
    for compute in ("float32", "int8"):
        VaswaniConverter(model, tokens).convert(f"{folder}/{compute}", quantization=compute)
        workers = kept_workers(Path(folder) / compute, compute, threads, tokens)  # as `--engine ctranslate2` runs it
        translators[compute] = (ctranslate2.Translator(f"{folder}/{compute}", device="cpu", compute_type=compute,
                                                       **workers), workers)
        torch.set_num_threads(threads)
    return translators


def onnx_model(model: VaswaniForConditionalGeneration, threads: int):
    """Our model exported as `vaswani-export onnx` exports it, in ONNX Runtime sessions; None without the packages."""
    try:
        from vaswani_hf.exports.onnx_runtime import OnnxSeq2Seq
        from vaswani_hf.exports.to_onnx import export
    except ImportError:
        return None
    folder = f"{scratch_folder()}/onnx"
    export(model, SimpleNamespace(save_pretrained=lambda _: None), folder)  # ids only: no tokenizer to save
    return OnnxSeq2Seq(folder, threads=threads)


def onnx_greedy(engine, source: torch.Tensor) -> None:
    output = engine.greedy(source, torch.ones_like(source), max_new_tokens=NEW_TOKENS)
    assert output.shape[1] == NEW_TOKENS + 1, output.shape


def ct2_generate(translator, source: torch.Tensor, num_beams: int, parts: int = 1) -> None:
    tokens = [[str(i) for i in row] for row in source.tolist()]  # the converted vocabulary is the ids' strings
    translator.translate_batch(tokens, beam_size=num_beams, min_decoding_length=NEW_TOKENS,
                               max_decoding_length=NEW_TOKENS, length_penalty=1.0,
                               max_batch_size=math.ceil(len(tokens) / parts))  # a part for each worker


def run_size(label: str, size: dict, repeats: int, threads: int) -> None:
    models = {"marian": build("marian", size), "plain": build("ours", size), "ours": fast_cpu(build("ours", size))}
    int8 = fast_cpu(quantize_int8(build("ours", size)))  # as `vaswani-translate --int8` decodes
    optimizers = {name: paper_adam(model) for name, model in models.items()}
    timings = {}

    def timed(key: str, fn) -> None:
        start = time.perf_counter()
        fn()
        timings.setdefault(key, []).append(time.perf_counter() - start)

    for repeat in range(repeats + 1):  # the first round warms up and is dropped
        source = random_tokens(TRAIN_BATCH, TRAIN_LENGTH, size["vocab_size"], 10 + repeat)
        target = random_tokens(TRAIN_BATCH, TRAIN_LENGTH, size["vocab_size"], 100 + repeat)
        prompt = random_tokens(GENERATE_BATCH, SOURCE_LENGTH, size["vocab_size"], 1000 + repeat)
        for name, model in list(models.items())[:: 1 if repeat % 2 else -1]:  # each goes first in turn
            model.train()
            timed(f"train {name}", partial(train_step, model, optimizers[name], source, target))
            model.eval()
            for beams in (1, 4):
                timed(f"beam{beams} {name}", partial(generate, model, prompt, beams))
        if repeat == 0:
            timings.clear()

    # Inference-only engines after the interleaved rounds, one engine at a time: the worker threads of one
    # runtime (fbgemm, CTranslate2) must not sit beside another's timings.
    def engine_rounds(name: str, engine, beam_sizes=(1, 4)) -> None:
        for repeat in range(repeats + 1):
            prompt = random_tokens(GENERATE_BATCH, SOURCE_LENGTH, size["vocab_size"], 1000 + repeat)
            for beams in beam_sizes:
                if repeat:  # the first round warms up
                    timed(f"beam{beams} {name}", partial(engine, prompt, beams))
                else:
                    engine(prompt, beams)

    engine_rounds("ours-int8", lambda prompt, beams: generate(int8, prompt, beams))
    ct2_workers = {}
    for compute, (translator, workers) in ctranslate2_translators(models["plain"].eval(), threads).items():
        engine_rounds(f"ct2-{compute}", partial(ct2_generate, translator, parts=workers["inter_threads"]))
        ct2_workers[compute] = f"{workers['inter_threads']} part(s) at once x {workers['intra_threads']} thread(s)"
    onnx = onnx_model(models["plain"].eval(), threads)
    if onnx is not None:
        # greedy only: the exported model's beam 4 would be the paper's search, not transformers'
        engine_rounds("onnx", lambda prompt, _: onnx_greedy(onnx, prompt), beam_sizes=(1,))

    train_tokens = TRAIN_BATCH * 2 * TRAIN_LENGTH
    new_tokens = GENERATE_BATCH * NEW_TOKENS
    memory = {name: peak_memory(partial(train_step, model.train(), optimizers[name], source, target))
              for name, model in models.items()}
    print(f"\n**{label}**: d_model {size['d_model']}, {size['num_layers']}+{size['num_layers']} layers, "
          f"{size['num_heads']} heads, d_ff {size['d_ff']}, vocabulary {size['vocab_size']}; "
          f"{threads} threads, median of {repeats}\n")
    print("| measure | MarianMTModel | ours, plain | plain / Marian | ours, `fast_cpu` | fast_cpu / Marian |")
    print("|---|---:|---:|---:|---:|---:|")
    rows = [("training tokens/s", "train", train_tokens), ("greedy generate tokens/s", "beam1", new_tokens),
            ("beam-4 generate tokens/s", "beam4", new_tokens)]
    for title, key, tokens in rows:
        marian, plain, ours = (tokens / statistics.median(timings[f"{key} {n}"]) for n in ("marian", "plain", "ours"))
        print(f"| {title} | {marian:.0f} | {plain:.0f} | {plain / marian:.2f}x | {ours:.0f} | {ours / marian:.2f}x |")
    print(f"| training-step peak memory (MiB) | {memory['marian']:.0f} | {memory['plain']:.0f} | "
          f"{memory['plain'] / memory['marian']:.2f}x | {memory['ours']:.0f} | "
          f"{memory['ours'] / memory['marian']:.2f}x |")
    for title, key in (("greedy", "beam1"), ("beam-4", "beam4")):
        marian, int8_speed = (new_tokens / statistics.median(timings[f"{key} {n}"]) for n in ("marian", "ours-int8"))
        print(f"| {title} generate tokens/s, ours int8 (`vaswani-translate --int8`) vs Marian fp32 | {marian:.0f} | "
              f"{int8_speed:.0f} | {int8_speed / marian:.2f}x |")
    for compute, ours_key in (("float32", "ours"), ("int8", "ours-int8")):
        for title, key in (("greedy", "beam1"), ("beam-4", "beam4")):
            if f"{key} ct2-{compute}" not in timings:
                continue
            ct2, ours = (new_tokens / statistics.median(timings[f"{key} {n}"]) for n in (f"ct2-{compute}", ours_key))
            print(f"| {title} tokens/s, our model in CTranslate2 {compute} (`vaswani-export`) vs ours {compute} | "
                  f"{ct2:.0f} | {ours:.0f} | {ours / ct2:.2f}x |")
    if "beam1 onnx" in timings:
        engine, ours = (new_tokens / statistics.median(timings[f"beam1 {n}"]) for n in ("onnx", "ours"))
        print(f"| greedy tokens/s, our model in ONNX Runtime float32 (`vaswani-export onnx`) vs ours float32 | "
              f"{engine:.0f} | {ours:.0f} | {ours / engine:.2f}x |")
    for name, model in (("fast_cpu", models["ours"]), ("the int8 copy", int8)):
        print(f"\n{name}'s plan for this size: {model.fast_cpu_plan}; its calls' best seconds: {plan_seconds(model)}")
    if ct2_workers:
        print(f"CTranslate2's workers, as `--engine ctranslate2` measured them: {ct2_workers}")


def plan_seconds(model: nn.Module) -> str:
    """The seconds of each candidate the plan was measured with, from the choices kept in the cache."""
    kept = [json.loads(path.read_text(encoding="utf-8")) for path in cache_root("fast_cpu").glob("*.json")]
    found = {entry["mode"]: entry["seconds"] for entry in kept if entry.get("int8") == is_int8(model)
             and entry["sizes"]["d_model"] == model.config.d_model
             and entry["sizes"]["vocab_size"] == model.config.vocab_size}  # the int8 copy's, or the float32's
    return "; ".join(f"{mode}: " + ", ".join(
        f"{'+'.join(name for name, on in candidate.items() if on and name != 'seconds') or 'plain'} "
        f"{candidate['seconds']:.3f}" for candidate in found[mode]) for mode in model.fast_cpu_plan if mode in found)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep-freed-memory", action="store_true",
                        help="vaswani_hf.keep_freed_memory() for the whole process, as vaswani-translate and "
                        "training run")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.keep_freed_memory:
        keep_freed_memory()
    os.environ["VASWANI_HF_CACHE"] = scratch_folder()  # fast_cpu measures its plan here, as a first call does
    print(f"CPU: {cpu_name()}, {args.threads} threads")
    for label in args.sizes:
        run_size(label, SIZES[label], args.repeats, args.threads)


if __name__ == "__main__":
    main()
