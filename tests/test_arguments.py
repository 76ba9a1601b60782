"""training/run.py's model flags reach the model it builds, over a preset's values."""

import sys

import pytest

from training.arguments import parse_arguments
from training.tokenizer import train_joint_bpe
from vaswani_hf import VaswaniForConditionalGeneration


@pytest.mark.parametrize(("flags", "encoder", "decoder"), [
    (["--num_layers", "3"], 3, 3),
    (["--num_layers", "3", "--num_decoder_layers", "1"], 3, 1),
    (["--preset", "cpu-medium"], 3, 3),
    (["--preset", "cpu-medium", "--num_decoder_layers", "2"], 3, 2),
])
def test_the_model_has_the_encoder_and_decoder_depths_the_flags_ask_for(monkeypatch, flags, encoder, decoder):
    monkeypatch.setattr(sys, "argv", ["run.py", *flags, "--d_model", "32", "--d_ff", "64", "--num_heads", "4"])
    _, model_args, _ = parse_arguments()
    tokenizer = train_joint_bpe(["a dog runs .", "ein Hund läuft ."], 60)
    model = VaswaniForConditionalGeneration(model_args.config(tokenizer))
    assert (len(model.model.encoder.layers), len(model.model.decoder.layers)) == (encoder, decoder)
