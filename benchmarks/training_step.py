"""Where a training step of the 25-minute recipe goes, and whether torch.compile or another way of drawing dropout
masks would make more steps in the budget.

    python benchmarks/training_step.py [--preset cpu-medium] [--steps 40] [--dropout P] [--no-compile]

The preset's model trained as `training/run.py` trains it: token batches of Multi30k's training pairs (joint BPE of
the preset's size), the paper's label-smoothed loss, the run's Adam (`paper_optimizer`: fused where torch has it),
the preset's gradient clipping and batches per step. P_drop is the preset's `dropout` unless `--dropout` gives the
value a run fits (`--dropout_epochs`: none in a run of under 10 epochs). Prints seconds per step, the first 5 left
out: eager (`fast_cpu`'s plan for the preset's sizes, as training/run.py: oneDNN or torch's BLAS), eager under
bfloat16 autocast (`--mixed_precision bf16`: plain `nn.Linear`) and compiled (`torch.compile(dynamic=True)`: plain
`nn.Linear`, Inductor, the loss compiled beside as training/step.py compiles it), the compile time, the eager step's
top operators, and dropout's masks drawn four ways at the step's shapes (median of 50).
"""

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from speed import seconds

from training.arguments import ModelArguments
from training.batching import collate, encode, token_batches
from training.loss import label_smoothed_nll, plain_label_smoothed_nll
from training.schedule import paper_optimizer
from training.step import tracing_options
from training.tokenizer import train_joint_bpe
from vaswani_hf import VaswaniForConditionalGeneration, fast_cpu
from vaswani_hf.modeling_vaswani import shift_tokens_right
from vaswani_hf.speed.kernels import cpu_name
from vaswani_hf.tools.text import read_lines

DATA = ROOT.parent / "shared" / "data" / "multi30k"
SKIPPED = 5  # steps left out of each timing: the allocator and caches settle
CPU_MAX_TOKENS = 4096  # training/run.py's batches on a CPU where --max_tokens is not given (batch_tokens)


def loss(model, batch, smoothed=label_smoothed_nll):
    """The step's forward as training/run.py's `accumulate_gradients` makes it, its loss by `smoothed`."""
    config = model.config
    decoder_input_ids = shift_tokens_right(batch["labels"], config.pad_token_id, config.decoder_start_token_id)
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   decoder_input_ids=decoder_input_ids, use_cache=False).logits
    return smoothed(logits, batch["labels"])[0]


def bfloat16_autocast(model, batch):
    """The step's forward as `--mixed_precision bf16` runs it on the CPU (Accelerate's autocast)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return loss(model, batch)


def train(model, forward, steps, per_step, max_grad_norm: float) -> list[float]:
    """Seconds of each step."""
    optimizer, _ = paper_optimizer(model, model.config.d_model, warmup_steps=400)
    times = []
    for step in range(steps):
        start = time.perf_counter()
        for batch in per_step[step % len(per_step)]:
            forward(model, batch).backward()
        if max_grad_norm:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - start)
    return times


def dropout_ways(p: float) -> dict:
    return {
        "F.dropout (bernoulli_)": lambda x: torch.nn.functional.dropout(x, p, True),
        "torch.native_dropout": lambda x: torch.native_dropout(x, p, True)[0],
        "rand_like(x) >= p": lambda x: x * (torch.rand_like(x) >= p) * (1 / (1 - p)),
        "boolean bernoulli_": lambda x: x * torch.empty_like(x, dtype=torch.bool).bernoulli_(1 - p) * (1 / (1 - p)),
    }


def step_batches(preset: dict, ids, pad_token_id: int, steps: int) -> list[list[dict]]:
    """The batches of each of `steps` optimizer steps as training/run.py makes them on one CPU process: batches of the
    preset's --max_tokens (none given: the CPU's default), as many a step as reach its tokens_per_step, the epoch's
    batches over again where a step needs more than it holds."""
    max_tokens = preset.get("max_tokens") or CPU_MAX_TOKENS
    accumulation = max(1, math.ceil(preset["tokens_per_step"] / max_tokens))
    batches = token_batches([len(s) for s in ids[0]], [len(t) for t in ids[1]], max_tokens, 0, 0)
    return [[collate(batches[i % len(batches)], *ids, pad_token_id, "cpu") for i in range(start, start + accumulation)]
            for start in range(0, accumulation * steps, accumulation)]


def step_count(text: str) -> int:
    value = int(text)
    if value <= SKIPPED:
        raise argparse.ArgumentTypeError(f"the first {SKIPPED} steps are left out: give at least {SKIPPED + 1}, "
                                         f"not {text}")
    return value


def probability(text: str) -> float:
    value = float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"P_drop must be in [0, 1), not {text}")
    return value


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu-medium",
                        choices=sorted(path.stem for path in (ROOT / "training" / "presets").glob("*.json")))
    parser.add_argument("--steps", type=step_count, default=40,
                        help=f"Steps timed each way; the first {SKIPPED} are left out.")
    parser.add_argument("--data", type=Path, default=DATA)
    parser.add_argument("--dropout", type=probability, help="P_drop (default: the preset's).")
    parser.add_argument("--no-compile", action="store_true")
    args = parser.parse_args()
    preset = json.loads((ROOT / "training" / "presets" / f"{args.preset}.json").read_text(encoding="utf-8"))
    sources, targets = read_lines(args.data / "train.en"), read_lines(args.data / "train.de")
    tokenizer = train_joint_bpe(sources + targets, preset["vocab_size"])
    ids = encode(tokenizer, list(zip(sources, targets)))
    per_step = step_batches(preset, ids, tokenizer.pad_token_id, args.steps)
    if args.dropout is not None:
        preset["dropout"] = args.dropout
    model_fields = {field.name for field in dataclasses.fields(ModelArguments)}  # the model's part of the preset
    config = ModelArguments(**{k: v for k, v in preset.items() if k in model_fields}).config(tokenizer)
    clip = preset.get("max_grad_norm", 0.0)
    print(f"{cpu_name()}, {torch.get_num_threads()} threads; {args.preset}: {len(per_step[0])} batch(es) of <= "
          f"{preset.get('max_tokens') or CPU_MAX_TOKENS} tokens a step, P_drop {config.dropout:g}, gradients clipped "
          f"at {clip or 'none'}")

    def model():
        torch.manual_seed(0)
        return fast_cpu(VaswaniForConditionalGeneration(config)).train()  # as training/run.py trains on a CPU

    train(model(), loss, len(per_step), per_step, clip)  # an untimed pass first: allocator and caches warm
    eager = train(model(), loss, args.steps, per_step, clip)[SKIPPED:]
    print(f"eager: {sum(eager) / len(eager):.3f} s a step")
    bf16 = train(model(), bfloat16_autocast, args.steps, per_step, clip)[SKIPPED:]
    print(f"eager, bfloat16 autocast (--mixed_precision bf16): {sum(bf16) / len(bf16):.3f} s a step")
    if not args.no_compile:  # the model and the plain loss compiled, as training/step.py compiles them
        plain = model()
        forward = torch.compile(plain, dynamic=True)
        smoothed = torch.compile(plain_label_smoothed_nll, dynamic=True)

        def compiled_loss(_, batch):
            with tracing_options():
                return loss(forward, batch, smoothed)

        compiled = train(plain, compiled_loss, args.steps, per_step, clip)
        steady = sum(compiled[SKIPPED:]) / len(compiled[SKIPPED:])
        print(f"torch.compile(dynamic=True): {steady:.3f} s a step, "
              f"{sum(compiled[:SKIPPED]) - SKIPPED * steady:.0f} s more in the first {SKIPPED} steps (compiling)")

    with profile(activities=[ProfilerActivity.CPU]) as profiler:
        train(model(), loss, 5, per_step, clip)
    events = sorted(profiler.key_averages(), key=lambda event: -event.self_cpu_time_total)
    total = sum(event.self_cpu_time_total for event in events)
    print("eager step, share of CPU time: " + ", ".join(
        f"{event.key} {event.self_cpu_time_total / total:.1%}" for event in events[:6]))

    if config.dropout:
        x = torch.randn(*per_step[0][0]["input_ids"].shape, preset["d_model"])
        print(f"dropout masks at {tuple(x.shape)}: " + ", ".join(
            f"{name} {seconds(lambda way=way: way(x), 50) * 1e3:.2f} ms"
            for name, way in dropout_ways(config.dropout).items()))


if __name__ == "__main__":
    main()
