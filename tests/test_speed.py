"""benchmarks/speed.py, which times ours beside MarianMTModel: each decoding call writes exactly the tokens it is
timed on, whatever the model would end the sentence with, and each figure of its table is its own engine's tokens
over its own call's seconds."""

import sys
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

from speed import EOS, build, generate, random_tokens

SIZE = {"d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 64, "vocab_size": 300}


@pytest.mark.parametrize("beams", [1, 4])
@pytest.mark.parametrize("name", ["ours", "marian"])
def test_every_call_writes_all_its_new_tokens_though_the_model_ends_each_sentence_at_once(name, beams):
    """The logits made to put </s> first at every step: a call that honoured the end of sentence would stop after
    one token (generate() asserts the length it wrote)."""
    model = build(name, SIZE).eval()
    calls = []

    def end_of_sentence_first(module, args, output):
        calls.append(1)
        output.logits[..., EOS] = 100.0

    model.register_forward_hook(end_of_sentence_first)
    generate(model, random_tokens(2, 5, SIZE["vocab_size"], seed=0), beams, new_tokens=6)
    assert len(calls) == 6


SECONDS = {"train": {"marian": 2.0, "plain": 1.6, "ours": 1.25}, 1: {"marian": 0.8, "plain": 0.5, "ours": 0.4,
           "int8": 0.25, "ct2-float32": 0.2, "ct2-int8": 0.1, "onnx": 0.16}, 4: {"marian": 3.2, "plain": 2.0,
           "ours": 1.6, "int8": 1.0, "ct2-float32": 0.64, "ct2-int8": 0.5}}
MEMORY = {"marian": 40.0, "plain": 30.0, "ours": 25.0}


def test_each_row_of_the_table_is_its_own_engines_tokens_over_its_own_seconds(monkeypatch, capsys):
    """Every timed call stood in for by a clock that moves by the seconds set for that engine and call (ten times as
    many in the first, warm-up round, which the medians leave out): each figure of the table is then known (tokens /
    seconds), and a figure read from another engine's or call's timings, or from the warm-up, shows."""
    import speed

    clock, calls = [0.0], Counter()
    monkeypatch.setattr(speed.time, "perf_counter", lambda: clock[0])

    def takes(call, engine):
        calls[call, engine] += 1
        clock[0] += SECONDS[call][engine] * (10 if calls[call, engine] == 1 else 1)

    def named(name):
        def name_it(model):
            model.speed_name, model.fast_cpu_plan = name, {}
            return model
        return name_it

    build = speed.build
    monkeypatch.setattr(speed, "build", lambda name, size: named({"ours": "plain"}.get(name, name))(build(name, size)))
    monkeypatch.setattr(speed, "fast_cpu", lambda model: named({"int8": "int8"}.get(model.speed_name, "ours"))(model))
    monkeypatch.setattr(speed, "quantize_int8", named("int8"))
    monkeypatch.setattr(speed, "train_step", lambda model, *_: takes("train", model.speed_name))
    monkeypatch.setattr(speed, "generate", lambda model, prompt, beams: takes(beams, model.speed_name))
    monkeypatch.setattr(speed, "peak_memory", lambda run: MEMORY[run.args[0].speed_name])
    workers = {"inter_threads": 1, "intra_threads": 2}
    monkeypatch.setattr(speed, "ctranslate2_translators", lambda model, threads: {
        compute: (f"ct2-{compute}", workers) for compute in ("float32", "int8")})
    monkeypatch.setattr(speed, "ct2_generate", lambda engine, prompt, beams, parts: takes(beams, engine))
    monkeypatch.setattr(speed, "onnx_model", lambda model, threads: "onnx")
    monkeypatch.setattr(speed, "onnx_greedy", lambda engine, prompt: takes(1, engine))
    monkeypatch.setattr(speed, "plan_seconds", lambda model: "")
    speed.run_size("tiny", SIZE, repeats=1, threads=2)  # a warm-up counted would make a median of two

    rows = {line.split(" | ")[0].strip("| "): line.strip("| ").split(" | ")[1:]
            for line in capsys.readouterr().out.splitlines() if line.startswith("| ")}
    train, new = speed.TRAIN_BATCH * 2 * speed.TRAIN_LENGTH, speed.GENERATE_BATCH * speed.NEW_TOKENS

    def rate(tokens, seconds):
        return f"{tokens / seconds:.0f}"

    for title, key, tokens in (("training tokens/s", "train", train), ("greedy generate tokens/s", 1, new),
                               ("beam-4 generate tokens/s", 4, new)):
        s = SECONDS[key]
        assert rows[title] == [rate(tokens, s["marian"]), rate(tokens, s["plain"]),
                               f"{s['marian'] / s['plain']:.2f}x", rate(tokens, s["ours"]),
                               f"{s['marian'] / s['ours']:.2f}x"], title
    assert rows["training-step peak memory (MiB)"] == ["40", "30", "0.75x", "25", "0.62x"]
    for title, beams in (("greedy", 1), ("beam-4", 4)):
        s = SECONDS[beams]
        assert rows[f"{title} generate tokens/s, ours int8 (`vaswani-translate --int8`) vs Marian fp32"] == [
            rate(new, s["marian"]), rate(new, s["int8"]), f"{s['marian'] / s['int8']:.2f}x"]
        for compute, ours in (("float32", "ours"), ("int8", "int8")):
            engine = f"{title} tokens/s, our model in CTranslate2 {compute} (`vaswani-export`) vs ours {compute}"
            assert rows[engine] == [rate(new, s[f"ct2-{compute}"]), rate(new, s[ours]),
                                    f"{s[f'ct2-{compute}'] / s[ours]:.2f}x"]
    assert rows["greedy tokens/s, our model in ONNX Runtime float32 (`vaswani-export onnx`) vs ours float32"] == [
        rate(new, 0.16), rate(new, 0.4), "0.40x"]
