"""Where a beam-4 `generate()` call of speed.py spends its time, ours against MarianMTModel, and what a target
ratio leaves for our decoder.

    python benchmarks/beam_budget.py                 # small size, target 1.9x
    python benchmarks/beam_budget.py --size base
    python benchmarks/beam_budget.py --beams 1       # a greedy call
    python benchmarks/beam_budget.py --keep-freed-memory   # glibc keeps freed memory for reuse (allocator.py)

For each model, interleaved in one process (median of --repeats calls each):
  * the real call (16 sources of 32 tokens, 32 new tokens, beam 4 or --beams, as in speed.py);
  * the same call with a decoder that costs nothing (its forward returns fixed logits): transformers' beam-search
    loop, its logits processors and the encoder — the floor no decoder can go below;
  * the page faults of the real call;
and for ours the decoder's linear products alone, back to back with nothing between them (packed weights, 16
sources x the beams, 32 steps) — the floor of our decoder's arithmetic. The budget is what the target
ratio leaves for our 32 decoder steps: Marian's call / target - our loop floor.
"""

import argparse
import resource
import statistics
import time

import torch
from speed import GENERATE_BATCH, NEW_TOKENS, SIZES, SOURCE_LENGTH, build, generate, random_tokens, seconds
from transformers.modeling_outputs import Seq2SeqLMOutput

from vaswani_hf import fast_cpu, keep_freed_memory
from vaswani_hf.speed.kernels import cpu_name


def step_layers(model) -> list:
    """The linear layers a decoder step runs: every one of the decoder's but the source's keys and values (computed
    once a call, then cached), and the output projection."""
    return [layer for decoder_layer in model.model.decoder.layers for layer in (
        decoder_layer.self_attn.q_proj, decoder_layer.self_attn.k_proj, decoder_layer.self_attn.v_proj,
        decoder_layer.self_attn.out_proj, decoder_layer.encoder_attn.q_proj, decoder_layer.encoder_attn.out_proj,
        decoder_layer.fc1, decoder_layer.fc2)] + [model.lm_head]


def decoder_products_ms(model, beams: int, repeats: int) -> float:
    """32 steps of our decoder's linear products on 16 x `beams` rows, back to back."""
    rows = GENERATE_BATCH * beams
    layers = step_layers(model)
    inputs = [torch.randn(rows, 1, layer.in_features) for layer in layers]

    def steps():
        for _ in range(NEW_TOKENS):
            for layer, x in zip(layers, inputs):
                layer(x)

    with torch.no_grad(), model.fast_decoding(4):
        return 1000 * seconds(steps, repeats)


def page_faults() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=list(SIZES), default="small")
    parser.add_argument("--target", type=float, default=1.9)
    parser.add_argument("--beams", type=int, default=4, help="the beam size of the call (1: greedy)")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep-freed-memory", action="store_true", help="vaswani_hf.keep_freed_memory() first")
    args = parser.parse_args()
    if args.beams < 1:
        raise SystemExit(f"error: --beams {args.beams}: a call needs at least one beam")
    torch.set_num_threads(args.threads)
    if args.keep_freed_memory:
        keep_freed_memory()
    size = SIZES[args.size]
    models = {"marian": build("marian", size).eval(), "ours": fast_cpu(build("ours", size)).eval()}
    free_logits = torch.randn(GENERATE_BATCH * args.beams, 1, size["vocab_size"])

    def free_forward(self, *args, cache=None, **kwargs):
        return Seq2SeqLMOutput(logits=free_logits.clone(), cache=cache)

    timings, faults = {}, {}
    for repeat in range(args.repeats + 1):  # the first round warms up
        prompt = random_tokens(GENERATE_BATCH, SOURCE_LENGTH, size["vocab_size"], 1000 + repeat)
        for name, model in models.items():
            for label in ("call", "loop"):
                real_forward = type(model).forward
                if label == "loop":
                    type(model).forward = free_forward
                start, faults_before = time.perf_counter(), page_faults()
                try:
                    generate(model, prompt, args.beams)
                finally:
                    type(model).forward = real_forward
                if repeat:
                    timings.setdefault((name, label), []).append(1000 * (time.perf_counter() - start))
                    faults.setdefault((name, label), []).append(page_faults() - faults_before)
    ms = {key: statistics.median(values) for key, values in timings.items()}
    steps = {name: ms[name, "call"] - ms[name, "loop"] for name in models}
    products = decoder_products_ms(models["ours"], args.beams, args.repeats)
    budget = ms["marian", "call"] / args.target - ms["ours", "loop"]

    print(f"\n**{args.size}**, beam {args.beams}, {cpu_name()}, {args.threads} threads, median ms of {args.repeats}\n")
    print("| | MarianMTModel | ours |\n|---|---:|---:|")
    print(f"| generate() call | {ms['marian', 'call']:.0f} | {ms['ours', 'call']:.0f} |")
    print(f"| loop floor: the call with a decoder that costs nothing | {ms['marian', 'loop']:.0f} | "
          f"{ms['ours', 'loop']:.0f} |")
    print(f"| 32 decoder steps (call - loop floor) | {steps['marian']:.0f} | {steps['ours']:.0f} |")
    print(f"| their linear products alone | | {products:.0f} |")
    print(f"| page faults per call (median) | {statistics.median(faults['marian', 'call']):,.0f} | "
          f"{statistics.median(faults['ours', 'call']):,.0f} |")
    print(f"\nours / Marian: {ms['marian', 'call'] / ms['ours', 'call']:.2f}x. For {args.target}x our 32 decoder "
          f"steps may take {budget:.0f} ms ({budget - products:.0f} ms beside the linear products); they take "
          f"{steps['ours']:.0f} ms ({steps['ours'] - products:.0f} ms beside them).")


if __name__ == "__main__":
    main()
