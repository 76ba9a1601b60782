"""Attention pictures like the paper's Figures 3-5: one heatmap per head, for a chosen layer.

    python -m vaswani_hf.tools.visualize MODEL --source "A man is riding a bike." [--target "..."] \\
        [--layer 4] [--output_dir attention]

writes `encoder_self_attention_layer{L}.png`, `decoder_self_attention_layer{L}.png` and
`cross_attention_layer{L}.png` (keys on the x axis, queries on the y axis, one panel per head). Without
`--target` the model's own translation is drawn. `attention_weights()` is the API underneath.
"""

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils.logging import disable_progress_bar

from .export import check_output_place
from .loading import load
from .translate import translate


@dataclass
class AttentionWeights:
    """Softmax weights of one layer. encoder: (h, S, S); decoder: (h, T, T), zero above the diagonal;
    cross: (h, T, S). Rows are queries and sum to 1; the token lists label the axes."""

    source_tokens: list[str]
    target_tokens: list[str]
    encoder: torch.Tensor
    decoder: torch.Tensor
    cross: torch.Tensor


@torch.no_grad()
def attention_weights(model, tokenizer, source: str, target: str | None = None, layer: int = -1) -> AttentionWeights:
    """The attention weights of `layer` (negative: from the top) for one sentence pair, teacher-forced: the decoder
    reads the start token and the target tokens. Without `target`, the model's translation of `source` is used. The
    model computes in eval mode (no dropout) and is left in its own."""
    device = next(model.parameters()).device
    inputs = tokenizer([source], return_tensors="pt").to(device)
    if target is None:
        target = translate(model, tokenizer, [source])[0]
    labels = tokenizer([target], return_tensors="pt")["input_ids"].to(device)
    decoder_input_ids = model.prepare_decoder_input_ids_from_labels(labels)
    implementation, training = model.config._attn_implementation, model.training
    model.set_attn_implementation("eager")  # the fused kernels do not return the weights
    try:
        outputs = model.eval()(**inputs, decoder_input_ids=decoder_input_ids, output_attentions=True, use_cache=False)
    finally:
        model.set_attn_implementation(implementation)
        model.train(training)
    num_layers = min(len(outputs.encoder_attentions), len(outputs.decoder_attentions))
    if not -num_layers <= layer < num_layers:
        raise ValueError(f"layer {layer} does not exist: the model has {num_layers} layers (0..{num_layers - 1})")
    return AttentionWeights(
        source_tokens=tokenizer.convert_ids_to_tokens(inputs["input_ids"][0]),
        target_tokens=tokenizer.convert_ids_to_tokens(decoder_input_ids[0]),
        encoder=outputs.encoder_attentions[layer][0].float().cpu(),
        decoder=outputs.decoder_attentions[layer][0].float().cpu(),
        cross=outputs.cross_attentions[layer][0].float().cpu(),
    )


def plot_heads(weights: torch.Tensor, query_tokens: list[str], key_tokens: list[str], title: str, path: Path) -> None:
    """One PNG: a grid of heatmaps, one per head, keys across and queries down."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = weights.shape[0]
    columns = min(4, heads)
    rows = math.ceil(heads / columns)
    cell = 0.22
    width = max(3.0, len(key_tokens) * cell + 1.2)
    height = max(3.0, len(query_tokens) * cell + 1.2)
    figure, axes = plt.subplots(rows, columns, figsize=(columns * width, rows * height), squeeze=False)
    for head, axis in enumerate(axes.flat):
        if head >= heads:
            axis.axis("off")
            continue
        axis.imshow(weights[head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
        axis.set_title(f"head {head + 1}", fontsize=9)
        axis.set_xticks(range(len(key_tokens)), key_tokens, rotation=90, fontsize=7)
        axis.set_yticks(range(len(query_tokens)), query_tokens, fontsize=7)
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def picture_paths(output_dir: Path, layer: int) -> list[Path]:
    names = ("encoder_self_attention", "decoder_self_attention", "cross_attention")
    return [output_dir / f"{name}_layer{layer}.png" for name in names]


def write_pictures(weights: AttentionWeights, output_dir: Path, layer: int) -> list[Path]:
    output_dir.mkdir(parents=True, exist_ok=True)
    source, target = weights.source_tokens, weights.target_tokens
    pictures = [
        (weights.encoder, source, source, "Encoder self-attention"),
        (weights.decoder, target, target, "Decoder self-attention (masked)"),
        (weights.cross, target, source, "Encoder-decoder attention"),
    ]
    paths = picture_paths(output_dir, layer)
    for path, (tensor, queries, keys, title) in zip(paths, pictures, strict=True):
        plot_heads(tensor, queries, keys, f"{title}, layer {layer}", path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Attention heatmaps (paper Figures 3-5) of one layer, all heads.")
    parser.add_argument("model", help="A model folder or Hub repository id.")
    parser.add_argument("--source", required=True, help="The source sentence.")
    parser.add_argument("--target", help="The target sentence (default: the model's translation).")
    parser.add_argument("--layer", type=int, default=-1, help="Layer index, from 0; negative counts from the top.")
    parser.add_argument("--output_dir", default="attention", help="Where the PNG files go.")
    parser.add_argument("--overwrite", action="store_true", help="Replace this layer's pictures in --output_dir.")
    args = parser.parse_args(argv)
    if not args.source.strip():
        raise SystemExit("error: --source is blank: give a sentence")
    if args.target is not None and not args.target.strip():
        raise SystemExit("error: --target is blank: give a sentence, or none for the model's translation")
    check_output_place(args.output_dir, "--output_dir")

    disable_progress_bar()  # transformers' weight-loading bar: an error is one line
    model, tokenizer = load(args.model, device="cpu")  # one-line errors for missing or broken model folders
    try:
        weights = attention_weights(model, tokenizer, args.source, args.target, args.layer)
    except ValueError as error:  # a layer that does not exist
        raise SystemExit(f"error: {error}") from None
    layer = args.layer % min(model.config.num_layers, model.config.num_decoder_layers)
    taken = [path for path in picture_paths(Path(args.output_dir), layer) if path.exists()]
    if taken and not args.overwrite:  # another sentence's pictures, perhaps
        raise SystemExit(f"error: {taken[0]} exists: give another --output_dir, or --overwrite")
    for path in write_pictures(weights, Path(args.output_dir), layer):
        print(path)


if __name__ == "__main__":
    main()
