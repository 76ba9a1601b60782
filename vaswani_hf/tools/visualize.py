"""Attention pictures like the paper's Figures 3-5: one heatmap per head, for a chosen layer.

    python -m vaswani_hf.tools.visualize MODEL --source "A man is riding a bike." [--target "..."] \\
        [--layer 4] [--output_dir attention]

writes `encoder_self_attention_layer{L}.png`, `decoder_self_attention_layer{L}.png` and
`cross_attention_layer{L}.png` (keys on the x axis, queries on the y axis, one panel per head). A negative `--layer`
counts from each stack's top, and a stack deeper than the other has pictures only it draws. Without `--target` the
model's own translation is drawn. `attention_weights()` is the API underneath.
"""

import argparse
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers.utils.logging import disable_progress_bar

from .export import check_output_place
from .loading import first_line, load
from .text import utf8_output
from .translate import translate


@dataclass
class AttentionWeights:
    """Softmax weights of one layer of each stack: encoder (h, S, S) of encoder layer `encoder_layer`; decoder
    (h, T, T), zero above the diagonal, and cross (h, T, S) of decoder layer `decoder_layer`; None for a stack
    without the layer asked for. Rows are queries and sum to 1; the token lists label the axes."""

    source_tokens: list[str]
    target_tokens: list[str]
    encoder: torch.Tensor | None
    decoder: torch.Tensor | None
    cross: torch.Tensor | None
    encoder_layer: int | None
    decoder_layer: int | None


def stack_layer(layer: int, count: int) -> int | None:
    """`layer` (negative: from the top) among a stack's `count` layers, from 0; None if the stack has no such layer."""
    return layer % count if -count <= layer < count else None


@torch.no_grad()
def attention_weights(model, tokenizer, source: str, target: str | None = None, layer: int = -1) -> AttentionWeights:
    """The attention weights of `layer` (negative: from each stack's top) for one sentence pair, teacher-forced: the
    decoder reads the start token and the target tokens. A stack deeper than the other has layers only it draws; a
    layer neither has is a one-line ValueError before anything is computed. Without `target`, the model's translation
    of `source` is used. The model computes in eval mode (no dropout) and is left in its own."""
    depths = model.config.num_layers, model.config.num_decoder_layers
    encoder_layer, decoder_layer = (stack_layer(layer, depth) for depth in depths)
    if encoder_layer is None and decoder_layer is None:
        raise ValueError(f"layer {layer} does not exist: the model has {depths[0]} encoder and {depths[1]} decoder "
                         "layers (from 0; negative from the top)")
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

    def head_weights(attentions, index):
        return None if index is None else attentions[index][0].float().cpu()

    return AttentionWeights(
        source_tokens=tokenizer.convert_ids_to_tokens(inputs["input_ids"][0]),
        target_tokens=tokenizer.convert_ids_to_tokens(decoder_input_ids[0]),
        encoder=head_weights(outputs.encoder_attentions, encoder_layer),
        decoder=head_weights(outputs.decoder_attentions, decoder_layer),
        cross=head_weights(outputs.cross_attentions, decoder_layer),
        encoder_layer=encoder_layer,
        decoder_layer=decoder_layer,
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


PICTURES = (("encoder_self_attention", "encoder", "Encoder self-attention"),
            ("decoder_self_attention", "decoder", "Decoder self-attention (masked)"),
            ("cross_attention", "cross", "Encoder-decoder attention"))


def pictures(weights: AttentionWeights, output_dir: Path) -> list[tuple]:
    """(path, weights, query tokens, key tokens, title) of each picture of the layer: the encoder's where the encoder
    has the layer, the decoder's two where the decoder has it."""
    source, target = weights.source_tokens, weights.target_tokens
    axes = {"encoder": (source, source), "decoder": (target, target), "cross": (target, source)}
    drawn = []
    for name, kind, title in PICTURES:
        layer = weights.encoder_layer if kind == "encoder" else weights.decoder_layer
        if layer is not None:
            drawn.append((output_dir / f"{name}_layer{layer}.png", getattr(weights, kind), *axes[kind],
                          f"{title}, layer {layer}"))
    return drawn


def write_pictures(weights: AttentionWeights, output_dir: Path) -> list[Path]:
    """The layer's pictures written; a picture that cannot be written whole (a full disk) is removed."""
    output_dir.mkdir(parents=True, exist_ok=True)
    drawn = pictures(weights, output_dir)
    for path, tensor, queries, keys, title in drawn:
        try:
            plot_heads(tensor, queries, keys, title, path)
        except OSError:
            path.unlink(missing_ok=True)
            raise
    return [path for path, *_ in drawn]


def main(argv: list[str] | None = None) -> None:
    utf8_output()
    parser = argparse.ArgumentParser(description="Attention heatmaps (paper Figures 3-5) of one layer, all heads.")
    parser.add_argument("model", help="A model folder or Hub repository id.")
    parser.add_argument("--source", required=True, help="The source sentence.")
    parser.add_argument("--target", help="The target sentence (default: the model's translation).")
    parser.add_argument("--layer", type=int, default=-1,
                        help="Layer index, from 0; negative counts from each stack's top.")
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
    taken = [path for path, *_ in pictures(weights, Path(args.output_dir)) if path.exists()]
    if taken and not args.overwrite:  # another sentence's pictures, perhaps
        raise SystemExit(f"error: {taken[0]} exists: give another --output_dir, or --overwrite")
    try:
        written = write_pictures(weights, Path(args.output_dir))
    except OSError as error:
        raise SystemExit(f"error: --output_dir {args.output_dir}: the pictures could not be written "
                         f"({first_line(error)})") from None
    print("\n".join(map(str, written)))


if __name__ == "__main__":
    main()
