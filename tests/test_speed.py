"""benchmarks/speed.py's decoding, which times ours beside MarianMTModel: each call writes exactly the tokens it is
timed on, whatever the model would end the sentence with."""

import sys
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
