"""training/run.py's model flags reach the model it builds, over a preset's values; the paper's presets."""

import sys

import pytest
import torch

from training.arguments import check_arguments, chosen_precision, on_gpu, parse_arguments
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


@pytest.mark.parametrize(("flags", "widths", "named"), [
    ([], (8, 8), "4 heads, "),
    (["--d_k", "4"], (4, 8), "4 heads (d_k 4, d_v 8), "),  # Table 3 row B: narrower keys, values as wide
    (["--d_k", "4", "--d_v", "6"], (4, 6), "4 heads (d_k 4, d_v 6), "),
    (["--d_v", "6"], (8, 6), "4 heads (d_k 8, d_v 6), "),
])
def test_table_3_row_bs_head_widths_reach_the_model_and_its_card(flags, widths, named):
    """--d_k and --d_v (default d_model / h) make each head's queries and keys, and its values, that wide; the card's
    sizes name them where they are not d_model / h; a fine-tuning run refuses them as a new model's."""
    from training.hub import architecture_text

    sizes = ["--d_model", "32", "--d_ff", "64", "--num_heads", "4", "--num_layers", "1", "--vocab_size", "100"]
    _, model_args, _ = parse_arguments([*sizes, *flags])
    model = VaswaniForConditionalGeneration(model_args.planned_config())
    for attention in (model.model.encoder.layers[0].self_attn, model.model.decoder.layers[0].encoder_attn):
        assert (attention.q_proj.out_features, attention.k_proj.out_features, attention.v_proj.out_features,
                attention.out_proj.in_features) == (4 * widths[0], 4 * widths[0], 4 * widths[1], 4 * widths[1])
    assert architecture_text(model.config) == (f"d_model 32, d_ff 64, {named}1 encoder and 1 decoder layers, a joint "
                                               "vocabulary of 100")
    for flag, value in zip(flags[::2], flags[1::2], strict=True):
        with pytest.raises(SystemExit, match=f"^error: {flag} is a new model's"):
            parse_arguments(["--model_name_or_path", "outputs/run", flag, value])


# The paper's models and recipes as it states them: Table 3 and §5-6.1 (base, big), and §6.3's parser: "a 4-layer
# transformer with d_model = 1024", "a vocabulary of 16K tokens", "a beam size of 21 and α = 0.3", "input length +
# 300", "all other parameters remained unchanged from the English-to-German base translation model".
BASE = {"num_layers": 6, "d_model": 512, "d_ff": 2048, "num_heads": 8, "dropout": 0.1, "vocab_size": 37000,
        "label_smoothing": 0.1, "tokens_per_step": 25000, "warmup_steps": 4000, "max_steps": 100_000,
        "save_minutes": 10, "average_checkpoints": 5, "num_beams": 4, "length_penalty_alpha": 0.6, "extra_length": 50}
PAPER = {"base": BASE,
         "big": {**BASE, "d_model": 1024, "d_ff": 4096, "num_heads": 16, "dropout": 0.3, "max_steps": 300_000,
                 "average_checkpoints": 20},
         "parsing": {**BASE, "num_layers": 4, "d_model": 1024, "vocab_size": 16000, "num_beams": 21,
                     "length_penalty_alpha": 0.3, "extra_length": 300}}


@pytest.mark.parametrize("preset", PAPER)
def test_the_papers_presets_are_its_models_and_recipes(monkeypatch, preset):
    monkeypatch.setattr(sys, "argv", ["run.py", "--preset", preset])
    values = {name: getattr(args, name) for args in parse_arguments() for name in PAPER[preset] if hasattr(args, name)}
    assert values == PAPER[preset]


def test_the_edges_of_each_range_are_accepted():
    """The least values and shares of 0 and 1 are values, not errors (label smoothing below 1: at 1 the target is
    uniform), and so are the seeds 0 and 2**32 - 1; --compile no is eager, not a backend's name."""
    edges = ["--max_steps", "1", "--max_tokens", "0", "--pad_to_multiple_of", "1", "--tokens_per_step", "1",
             "--warmup_steps", "1", "--logging_steps", "1", "--eval_steps", "0", "--eval_max_sentences", "1",
             "--save_steps", "0", "--save_minutes", "0", "--average_checkpoints", "1", "--evaluations", "0",
             "--num_beams", "1", "--extra_length", "0", "--max_grad_norm", "0", "--length_penalty_alpha", "0",
             "--dropout_epochs", "0", "1", "--compile", "no", "--no_fast_cpu"]
    for seed, shares in (("0", ["0"] * 4), (str(2**32 - 1), ["0.999", "1", "1", "1"])):
        named = [flag for name, share in zip(("label_smoothing", "warmup_share", "cooldown_share", "average_share"),
                                             shares, strict=True) for flag in (f"--{name}", share)]
        check_arguments(*parse_arguments([*edges, "--seed", seed, *named]), gpu=False)


def test_fine_tuning_takes_only_the_dropouts_it_is_given_and_a_new_model_all_three():
    """With --model_name_or_path, a dropout flag not given is the start's (None here), not the paper's default."""
    assert parse_arguments(["--model_name_or_path", "start", "--dropout", "0.3"])[1].dropouts() == {"dropout": 0.3}
    assert parse_arguments(["--model_name_or_path", "start"])[1].dropouts() == {}
    assert parse_arguments([])[1].dropouts() == {"dropout": 0.1, "attention_dropout": 0.0, "activation_dropout": 0.0}


@pytest.mark.parametrize(("launcher", "bf16_gpu", "chosen"), [
    (None, True, "bf16"), ("no", True, "bf16"), ("bf16", True, "bf16"), ("fp16", True, "fp16"),
    ("no", False, "fp16"), ("bf16", False, "fp16")])  # the shipped DDP config's bf16 on a GPU without it: fp16
def test_mixed_precision_auto_on_a_gpu(monkeypatch, launcher, bf16_gpu, chosen):
    """On a GPU `auto` is bf16, or fp16 where the GPU has no bf16 or the launcher names fp16."""
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *args, **kwargs: bf16_gpu)
    if launcher is None:
        monkeypatch.delenv("ACCELERATE_MIXED_PRECISION", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", launcher)
    assert chosen_precision("auto", gpu=True) == chosen
    assert chosen_precision("no", gpu=True) == "no"  # the run's own flag wins


@pytest.mark.parametrize(("gpu", "launcher_cpu", "trained_on_gpu"), [
    (True, None, True), (True, "false", True), (True, "true", False), (False, None, False)])
def test_a_run_is_on_a_gpu_unless_accelerate_launch_asks_for_the_cpu(monkeypatch, gpu, launcher_cpu, trained_on_gpu):
    """`accelerate launch --cpu` on a machine with a GPU: Accelerate puts the run on the CPU, so run.py chooses its
    precision, compilation, threads and fast_cpu for a CPU (it took the GPU's: bf16, and no thread sharing)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: gpu)
    if launcher_cpu is None:
        monkeypatch.delenv("ACCELERATE_USE_CPU", raising=False)
    else:
        monkeypatch.setenv("ACCELERATE_USE_CPU", launcher_cpu)
    assert on_gpu() == trained_on_gpu
