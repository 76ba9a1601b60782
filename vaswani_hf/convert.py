"""`vaswani-convert`: published weights of the paper's architecture as a vaswani_hf model folder.

    vaswani-convert marian Helsinki-NLP/opus-mt-en-de opus-mt-en-de     # a MarianMTModel folder or Hub id

What it writes is an ordinary vaswani_hf folder: safetensors weights, config, the code files, the source's tokenizer,
the generation config the source was published with, and a model card naming the source and its license. The
project's tools take it: `vaswani-translate`, the pipeline, `vaswani-export`, remote-code loading, `vaswani-push`.

Where the source computes differently from the paper, a config option says so (the one list of deviations is the
docstring of `modeling_vaswani.py`), and the weights are copied unchanged:

- Marian (the OPUS-MT models): the sinusoids in two halves (`position_encoding_layout="halves"`), the feed-forward
  non-linearity of its config (`activation_function`; swish for OPUS-MT), LayerNorm epsilon 1e-5, a fixed output bias
  (`add_final_logits_bias`), decoding that starts from the padding token. Its tokenizer is transformers'
  `MarianTokenizer` (SentencePiece), saved as it is: `pip install "vaswani_hf[convert]"`.

OUT must not exist; it is written under a temporary name beside it and renamed when whole, so a failed or killed
conversion leaves nothing under its name.
"""

import argparse
import copy
import importlib
import json
from pathlib import Path

import torch
from transformers import AutoConfig, AutoTokenizer
from transformers.utils.logging import disable_progress_bar

from .configuration_vaswani import VaswaniConfig
from .export import written_whole
from .modeling_vaswani import VaswaniForConditionalGeneration

SOURCE_PACKAGES = {"marian": ("sentencepiece", "sacremoses")}


def check_packages(source: str) -> None:
    missing = [name for name in SOURCE_PACKAGES[source] if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"error: vaswani-convert {source} needs {', '.join(missing)}: "
                         f"pip install {' '.join(missing)}  (or pip install \"vaswani_hf[convert]\")")


def marian_config(marian) -> VaswaniConfig:
    """The VaswaniConfig computing what `marian` (a MarianConfig) computes; what has no counterpart here is a
    ValueError naming it."""
    unsupported = []
    if not marian.share_encoder_decoder_embeddings:
        unsupported.append("separate source and target vocabularies (share_encoder_decoder_embeddings=False)")
    for name in ("ffn_dim", "attention_heads"):
        if getattr(marian, f"encoder_{name}") != getattr(marian, f"decoder_{name}"):
            unsupported.append(f"encoder_{name} != decoder_{name}")
    activation = {"silu": "swish"}.get(marian.activation_function, marian.activation_function)
    if activation not in ("relu", "swish", "gelu"):
        unsupported.append(f"activation_function={marian.activation_function!r}")
    if getattr(marian, "normalize_before", False):
        unsupported.append("normalize_before=True")  # MarianMTModel is post-LN; such a config is not its model
    if unsupported:
        raise ValueError(f"this Marian model has {', '.join(unsupported)}, which vaswani_hf does not compute")
    return VaswaniConfig(
        vocab_size=marian.vocab_size, d_model=marian.d_model, d_ff=marian.encoder_ffn_dim,
        num_heads=marian.encoder_attention_heads, num_layers=marian.encoder_layers,
        num_decoder_layers=marian.decoder_layers, dropout=marian.dropout, attention_dropout=marian.attention_dropout,
        activation_dropout=marian.activation_dropout, activation_function=activation,
        layer_norm_eps=1e-5,  # torch's default, which MarianMTModel's LayerNorms keep
        position_encoding_layout="halves", max_position_embeddings=marian.max_position_embeddings,
        scale_embedding=marian.scale_embedding, tie_word_embeddings=marian.tie_word_embeddings,
        add_final_logits_bias=True, pad_token_id=marian.pad_token_id, bos_token_id=marian.bos_token_id,
        eos_token_id=marian.eos_token_id, decoder_start_token_id=marian.decoder_start_token_id,
    )


def from_marian(name_or_path: str):
    """(model, tokenizer) of a MarianMTModel folder or Hub id, with the generation config it was published with."""
    from transformers import MarianMTModel

    source = AutoConfig.from_pretrained(name_or_path)
    if source.model_type != "marian":
        raise ValueError(f"{name_or_path} holds a {source.model_type!r} model, not a Marian one")
    config = marian_config(source)  # what cannot be converted is found before the weights are read
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if len(tokenizer) != config.vocab_size:
        raise ValueError(f"its tokenizer has {len(tokenizer)} tokens but its embedding {config.vocab_size} rows")
    marian = MarianMTModel.from_pretrained(name_or_path, dtype=torch.float32)
    # The same parameter names as ours (both follow BART's); the shared embedding is ours under the names it is tied
    # to, and the positions are computed, not stored.
    weights = {name: tensor for name, tensor in marian.state_dict().items()
               if name != "model.shared.weight" and ".embed_positions." not in name}
    model = VaswaniForConditionalGeneration(config)
    model.load_state_dict(weights, strict=True)
    model.generation_config = copy.deepcopy(marian.generation_config)
    model.generation_config._from_model_config = False  # the decoding it was published with (vaswani-translate)
    return model.eval(), tokenizer


CONVERTERS = {"marian": from_marian}


def source_license(name_or_path: str) -> str | None:
    """The license the source's model card declares, if it has one where it can be read."""
    from huggingface_hub import ModelCard

    card = Path(name_or_path) / "README.md"
    try:
        return ModelCard.load(card if card.is_file() else name_or_path).data.license
    except Exception:  # noqa: BLE001 - no card, no network, no metadata: the card says the license is unknown
        return None


# The options by which a converted model computes differently from the paper (modeling_vaswani.py's list).
DEVIATIONS = ("activation_function", "add_final_logits_bias", "position_encoding_layout",
              "position_encoding_frequencies", "position_offset", "layer_norm_eps", "normalize_before",
              "scale_embedding", "tie_word_embeddings")


def model_card(model, source: str, kind: str, name_or_path: str) -> str:
    """README.md of the converted folder: where the weights come from, their license, size and deviations."""
    license_ = source_license(name_or_path)
    config, paper = model.config, VaswaniConfig()
    metadata = {"library_name": "transformers", "tags": ["translation", "vaswani_hf", kind],
                **({"license": license_} if license_ else {}),
                **({} if Path(name_or_path).exists() else {"base_model": name_or_path})}
    front = "\n".join(f"{key}: {json.dumps(value)}" for key, value in metadata.items())
    deviations = [f"- `{name}={getattr(config, name)!r}`" for name in DEVIATIONS
                  if getattr(config, name) != getattr(paper, name)]
    return (
        f"---\n{front}\n---\n\n# {Path(name_or_path).name} in vaswani_hf\n\n"
        f"The weights of the {source} model `{name_or_path}`, converted with `vaswani-convert {kind}`: they are that "
        f"model's, under its license ({license_ or 'not stated in its model card: see the source'}); nothing was "
        f"trained or changed.\n\n{config.num_layers} encoder and {config.num_decoder_layers} decoder layers, "
        f"d_model {config.d_model}, d_ff {config.d_ff}, {config.num_heads} heads, a vocabulary of "
        f"{config.vocab_size:,}; {model.num_parameters():,} parameters. The decoder starts from token "
        f"{config.decoder_start_token_id}.\n\nWhat it computes differently from the paper, each a config option "
        f"(off by default):\n\n" + "\n".join(deviations)
        + "\n\n`generation_config.json` holds the source's decoding; `vaswani-translate --alpha A` decodes the "
        "paper's way instead (beam search with the GNMT length penalty, §6.1).\n"
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="vaswani-convert", description=__doc__.splitlines()[0].split(": ", 1)[1])
    sources = parser.add_subparsers(dest="source", required=True)
    marian = sources.add_parser("marian", help="a MarianMTModel (the OPUS-MT models): folder or Hub id")
    marian.add_argument("model", help="a MarianMTModel folder or Hub repository id")
    for source in (marian,):
        source.add_argument("output", help="the folder to write (must not exist)")
    args = parser.parse_args(argv)

    if Path(args.output).exists():
        raise SystemExit(f"error: {args.output} exists: give a folder that does not")
    if Path(args.model).is_dir() and not (Path(args.model) / "config.json").is_file():
        raise SystemExit(f"error: {args.model} is not a model folder (no config.json there)")
    check_packages(args.source)
    disable_progress_bar()
    try:
        model, tokenizer = CONVERTERS[args.source](args.model)
    except (OSError, ValueError, RuntimeError) as error:  # RuntimeError: weights that do not fit the config
        raise SystemExit(f"error: cannot convert {args.model}: {str(error).strip().splitlines()[0]}") from None
    with written_whole(args.output) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / "README.md").write_text(model_card(model, "Marian", args.source, args.model))
    print(f"wrote {args.output}: vaswani-translate --model {args.output} translates with it")


if __name__ == "__main__":
    main()
