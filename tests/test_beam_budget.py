"""benchmarks/beam_budget.py: the layers it times as our decoder's products are those a decoder step runs, and its
loop floor is the call without the decoder: it runs no decoder step, the timed call one a new token, and each model
class gets its own forward back."""

import sys
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))

import beam_budget
from speed import NEW_TOKENS, build, generate, random_tokens

SIZE = {"d_model": 32, "num_layers": 2, "num_heads": 4, "d_ff": 64, "vocab_size": 300}


def test_the_timed_products_are_the_linear_layers_each_decoder_step_runs():
    model = build("ours", SIZE).eval()
    runs = Counter()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_hook(lambda module, args, output: runs.update([module]))
    generate(model, random_tokens(2, 5, SIZE["vocab_size"], seed=0), 4, new_tokens=3)
    each_step = {module for module, count in runs.items() if count == 3}
    assert each_step == set(beam_budget.step_layers(model))
    assert set(runs.values()) == {1, 3}  # the others once a call: the encoder's, the source's keys and values


def test_the_loop_floor_runs_no_decoder_step_and_the_call_one_a_token(monkeypatch, capsys):
    decoder_steps, forwards, calls = Counter(), {}, []

    def counted(name, size):
        model = build(name, size)
        forwards[type(model)] = type(model).forward
        model.model.decoder.register_forward_hook(lambda *_: decoder_steps.update([model]))
        return model

    def call(model, *args):
        before = decoder_steps[model]
        generate(model, *args)
        calls.append((type(model).forward is forwards[type(model)], decoder_steps[model] - before))

    monkeypatch.setattr(beam_budget, "SIZES", {"tiny": SIZE})
    monkeypatch.setattr(beam_budget, "build", counted)
    monkeypatch.setattr(beam_budget, "generate", call)
    monkeypatch.setattr(sys, "argv", ["beam_budget.py", "--size", "tiny", "--repeats", "2",
                                      "--threads", str(torch.get_num_threads())])
    beam_budget.main()
    assert calls == [(True, NEW_TOKENS), (False, 0)] * 6  # 3 rounds of 2 models: the call, then its floor
    assert all(owner.forward is forward for owner, forward in forwards.items())  # each class's own forward back
    out = capsys.readouterr().out
    assert "| loop floor: the call with a decoder that costs nothing |" in out and "ours / Marian: " in out
