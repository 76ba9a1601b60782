"""`vaswani-convert`: published weights of the paper's architecture as a vaswani_hf model folder.

    vaswani-convert marian Helsinki-NLP/opus-mt-en-de opus-mt-en-de     # a MarianMTModel folder or Hub id
    vaswani-convert fairseq wmt16.en-de.joined-dict.transformer wmt16-en-de   # fairseq's release folder
    vaswani-convert fsmt facebook/wmt19-en-de wmt19-en-de               # an FSMT folder or Hub id

What it writes is an ordinary vaswani_hf folder: safetensors weights, config, the code files, the source's tokenizer,
the generation config the source was published with, and a model card naming the source and its license. The
project's tools take it: `vaswani-translate`, the pipeline, `vaswani-export`, remote-code loading, `vaswani-push`.

Where the source computes differently from the paper, a config option says so (the one list of deviations is
`configuration_vaswani.PAPER_ARCHITECTURE`, which the card prints), and the weights are copied unchanged:

- Marian (the OPUS-MT models): the sinusoids in two halves (`position_encoding_layout="halves"`), the feed-forward
  non-linearity of its config (`activation_function`; swish for OPUS-MT), LayerNorm epsilon 1e-5, a fixed output bias
  (`add_final_logits_bias`), decoding that starts from the padding token. Its tokenizer is transformers'
  `MarianTokenizer` (SentencePiece), saved as it is: `pip install "vaswani_hf[convert]"`.
- fairseq (the Transformers of Ott et al., 2018, trained on WMT as the paper was): the sinusoids in two halves with
  fairseq's frequencies (`position_encoding_frequencies="fairseq"`), positions that start after the padding index
  (`position_offset=2`), LayerNorm epsilon 1e-5, decoding that starts from `</s>`. The folder as fairseq releases it:
  `model.pt`, `dict.SRC.txt`, `dict.TGT.txt` (one joint vocabulary) and `bpecodes`. The checkpoint, a pickle, is read
  with `torch.load(weights_only=True)` and an allow-list besides tensors and builtins: `argparse.Namespace` (its
  training arguments) and fairseq's meters, which stand-ins without code receive (`ALLOWED_GLOBALS`); old
  checkpoints' fused attention projections (`in_proj_weight`) and layer-norm names are renamed as fairseq itself
  upgrades them. The tokenizer is transformers' `FSMTTokenizer` (Moses, then the BPE of `bpecodes`), written from the
  dictionary and the codes; the generation config is the paper's beam 4 with fairseq's length penalty 0.6
  (`length_penalty`, |Y|^0.6), as Ott et al. decoded.
- FSMT (transformers' port of fairseq's Transformer: facebook/wmt19-*, allenai/wmt16-*): fairseq's computation, as
  above, from a transformers folder: its weights, its `FSMTTokenizer` saved as it is, its generation config. One
  vocabulary for both sides, as fairseq's joined dictionaries are; the three embedding matrices tied where they are
  equal, else each kept (`tie_word_embeddings=False`).

OUT must not exist; it is written under a temporary name beside it and renamed when whole, so a failed or killed
conversion leaves nothing under its name.
"""

import argparse
import copy
import importlib.util
import json
import pickle
import re
import tempfile
from pathlib import Path

import torch
from safetensors import SafetensorError
from transformers import AutoConfig, AutoTokenizer, GenerationConfig
from transformers.utils.logging import disable_progress_bar

from ..configuration_vaswani import VaswaniConfig
from ..modeling_vaswani import VaswaniForConditionalGeneration
from ..tools.export import check_output_place, written_whole
from ..tools.loading import is_local, refuse_blank_model
from ..tools.text import utf8_output

SOURCE_PACKAGES = {"marian": ("sentencepiece", "sacremoses"), "fairseq": ("sacremoses",), "fsmt": ("sacremoses",)}


def check_packages(source: str) -> None:
    missing = [name for name in SOURCE_PACKAGES[source] if importlib.util.find_spec(name) is None]
    if missing:
        raise SystemExit(f"error: vaswani-convert {source} needs {', '.join(missing)}: "
                         f"pip install {' '.join(missing)} (or pip install \"vaswani_hf[convert]\")")


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


def with_weights(config: VaswaniConfig, weights: dict) -> VaswaniForConditionalGeneration:
    """The model of `config` holding `weights`, every one of its parameters and nothing else (a ValueError names the
    first that are missing, left over or of another shape)."""
    model = VaswaniForConditionalGeneration(config)
    expected = model.state_dict()
    problems = {"missing": sorted(set(expected) - set(weights)), "not ours": sorted(set(weights) - set(expected)),
                "of another shape": sorted(name for name in set(expected) & set(weights)
                                           if expected[name].shape != weights[name].shape)}
    found = [f"{kind}: {', '.join(names[:3])}{', ...' if len(names) > 3 else ''}" for kind, names in problems.items()
             if names]
    if found:
        raise ValueError(f"its weights do not fit the model its config describes ({'; '.join(found)})")
    model.load_state_dict(weights, strict=True)
    return model


MARIAN_TOKENIZER = ("source.spm", "target.spm", "vocab.json")  # what MarianTokenizer reads
FAST_TOKENIZER = "tokenizer.json"  # or tokenizers' JSON, as `vaswani-export marian` writes it


def published_config(name_or_path: str, model_type: str, kind: str):
    """The transformers config of a model folder or Hub id, which must be of `model_type`, `kind` (a Marian model,
    ...): else a one-line ValueError."""
    if is_local(name_or_path) and not (Path(name_or_path) / "config.json").is_file():
        raise ValueError(f"{name_or_path} is not a model folder (no config.json there)")
    source = AutoConfig.from_pretrained(name_or_path)
    if source.model_type != model_type:
        raise ValueError(f"{name_or_path} holds a {source.model_type!r} model, not {kind} one")
    return source


def published_decoding(model, source) -> None:
    """Gives `model` the generation config of `source`, the model it was converted from: the decoding it was
    published with, which vaswani-translate keeps."""
    model.generation_config = copy.deepcopy(source.generation_config)
    model.generation_config._from_model_config = False


def from_marian(name_or_path: str):
    """(model, tokenizer) of a MarianMTModel folder or Hub id, with the generation config it was published with."""
    from transformers import MarianMTModel

    config = marian_config(published_config(name_or_path, "marian", "a Marian"))  # found before the weights are read
    if is_local(name_or_path) and not (Path(name_or_path) / FAST_TOKENIZER).is_file() and (
            missing := [name for name in MARIAN_TOKENIZER if not (Path(name_or_path) / name).is_file()]):
        # (transformers' MarianTokenizer: a TypeError)
        raise ValueError(f"its tokenizer is incomplete (no {', '.join(missing)} there, nor a {FAST_TOKENIZER})")
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if len(tokenizer) != config.vocab_size:
        raise ValueError(f"its tokenizer has {len(tokenizer)} tokens but its embedding {config.vocab_size} rows")
    marian = MarianMTModel.from_pretrained(name_or_path, dtype=torch.float32)
    # The same parameter names as ours (both follow BART's); the shared embedding is ours under the names it is tied
    # to, and the positions are computed, not stored.
    weights = {name: tensor for name, tensor in marian.state_dict().items()
               if name != "model.shared.weight" and ".embed_positions." not in name}
    model = with_weights(config, weights)
    published_decoding(model, marian)
    return model.eval(), tokenizer


FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # ids 0-3 of every fairseq dictionary
# Old fairseq layers kept their LayerNorms in a list (fairseq renames them on load, as here).
OLD_LAYER_NORMS = {"encoder": ("self_attn_layer_norm", "final_layer_norm"),
                   "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm")}


class Inert:
    """Stands in, when a checkpoint is read, for a class of fairseq's training bookkeeping (its meters): it keeps the
    pickled state and runs none of fairseq's code (fairseq need not be installed)."""

    def __setstate__(self, state):
        self.state = state


# What fairseq's checkpoints of the paper's model hold besides tensors and builtins: the training arguments, and the
# meters of its training loop (fairseq.meters until 2019, fairseq.logging.meters since), read as `Inert`.
FAIRSEQ_METERS = [f"fairseq.{module}.{name}" for module in ("meters", "logging.meters")
                  for name in ("AverageMeter", "TimeMeter", "StopwatchMeter")]
ALLOWED_GLOBALS = [argparse.Namespace, *((Inert, name) for name in FAIRSEQ_METERS)]


def read_checkpoint(path: Path) -> dict:
    """A fairseq checkpoint, unpickled with only tensors, builtins and `ALLOWED_GLOBALS` allowed."""
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:
        found = re.search(r"GLOBAL (\S+)", str(error))
        detail = str(error).split("WeightsUnpickler error:", 1)[-1].strip().splitlines()
        what = f"it holds {found.group(1)}" if found else detail[0] if detail else "it holds something else"
        raise ValueError(f"{path} is refused: {what} (only tensors, builtins, argparse.Namespace and fairseq's meters "
                         "are read from its pickle)") from None
    except (RuntimeError, EOFError) as error:  # a legacy (pre-zip) checkpoint cut short: an EOFError saying nothing
        reason = (str(error).strip().splitlines() or ["it ends too soon"])[0]
        raise ValueError(f"{path} is not a readable torch checkpoint ({reason})") from None
    keys = sorted(state) if isinstance(state, dict) else type(state).__name__
    if "model" not in keys or not isinstance(state.get("args"), argparse.Namespace):
        raise ValueError(f"{path} is not a fairseq checkpoint with its training arguments (it holds {keys})")
    return state


def read_dictionary(path: Path) -> list[str]:
    """fairseq's Dictionary: its four special symbols, then one word per line ("word count [#fairseq:overwrite]")."""
    words = list(FAIRSEQ_SPECIALS)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        fields = line.rstrip().rsplit(" ", 2 if line.rstrip().endswith("#fairseq:overwrite") else 1)
        if len(fields) < 2 or not fields[1].isdigit():
            raise ValueError(f"{path}, line {number}: not \"word count\" ({line[:40]!r})")
        words.append(fields[0])
    return words


# What fairseq's Transformer computes unlike the paper (FSMT, its port, too): sinusoids in two halves with fairseq's
# frequencies, positions counted from after the padding index (1), torch's LayerNorm epsilon; and its special tokens,
# decoding from </s> (fairseq's <s>, <pad>, </s>: 0, 1, 2).
FAIRSEQ_COMPUTATION = {"layer_norm_eps": 1e-5, "position_encoding_layout": "halves",
                       "position_encoding_frequencies": "fairseq", "position_offset": 2,
                       "bos_token_id": 0, "pad_token_id": 1, "eos_token_id": 2, "decoder_start_token_id": 2}


def fairseq_config(args: argparse.Namespace, vocab_size: int) -> VaswaniConfig:
    """The VaswaniConfig computing what the fairseq Transformer of `args` computes (a ValueError names what has no
    counterpart here)."""
    def arg(name, default=None):
        return getattr(args, name, default)

    unsupported = [f"encoder_{name} != decoder_{name}"
                   for name in ("embed_dim", "ffn_embed_dim", "attention_heads", "normalize_before")
                   if arg(f"encoder_{name}") != arg(f"decoder_{name}")]
    unsupported += [name for name in ("encoder_learned_pos", "decoder_learned_pos", "no_token_positional_embeddings",
                                      "layernorm_embedding", "adaptive_softmax_cutoff", "cross_self_attention")
                    if arg(name)]
    activation = arg("activation_fn", "relu")
    if activation not in ("relu", "gelu"):
        unsupported.append(f"activation_fn={activation!r}")
    if unsupported:
        raise ValueError(f"its model ({arg('arch')}) has {', '.join(unsupported)}, which vaswani_hf does not compute")
    return VaswaniConfig(
        vocab_size=vocab_size, d_model=args.encoder_embed_dim, d_ff=args.encoder_ffn_embed_dim,
        num_heads=args.encoder_attention_heads, num_layers=args.encoder_layers, num_decoder_layers=args.decoder_layers,
        dropout=arg("dropout", 0.1), attention_dropout=arg("attention_dropout", 0.0),
        activation_dropout=arg("activation_dropout", arg("relu_dropout", 0.0)), activation_function=activation,
        max_position_embeddings=arg("max_source_positions", 1024),
        scale_embedding=not arg("no_scale_embedding", False), tie_word_embeddings=bool(arg("share_all_embeddings")),
        normalize_before=bool(arg("encoder_normalize_before")), **FAIRSEQ_COMPUTATION,
    )


def fairseq_weights(weights: dict) -> dict:
    """fairseq's parameters under our names: the same names under `model.`, old LayerNorm lists and fused attention
    projections (`in_proj_weight`: queries, keys, values stacked) split, the output projection as `lm_head`."""
    ours = {}
    for name, tensor in weights.items():
        if name.endswith((".version", "._float_tensor")):  # a format number; the sinusoids' device placeholder
            continue
        norms = OLD_LAYER_NORMS.get(name.split(".", 1)[0], ())
        name = re.sub(r"\.layer_norms\.(\d)\.", lambda m, norms=norms: f".{norms[int(m.group(1))]}.", name)
        if name in ("decoder.embed_out", "decoder.output_projection.weight"):
            ours["lm_head.weight"] = tensor
        elif re.search(r"\.in_proj_(weight|bias)$", name):
            for part, chunk in zip(("q", "k", "v"), tensor.chunk(3), strict=True):
                ours["model." + name.replace("in_proj_", f"{part}_proj.")] = chunk
        else:
            ours["model." + name] = tensor
    ours.setdefault("lm_head.weight", ours.get("model.decoder.embed_tokens.weight"))  # tied, stored once
    return ours


def fsmt_tokenizer(words: list[str], codes: Path, source_lang: str, target_lang: str):
    """transformers' FSMTTokenizer for fairseq's Moses + subword-nmt pipeline: the dictionary with subword-nmt's
    "@@" continuation marks turned into end-of-word marks ("</w>"), and the codes as ranked merges."""
    from transformers import FSMTTokenizer

    vocab = {word if word in FAIRSEQ_SPECIALS else word[:-2] if word.endswith("@@") else f"{word}</w>": i
             for i, word in enumerate(words)}
    merges = [" ".join(line.split()[:2]) for line in codes.read_text(encoding="utf-8").splitlines()
              if line.strip() and not line.startswith("#version")]
    with tempfile.TemporaryDirectory() as folder:
        files = {name: Path(folder) / name for name in ("vocab.json", "merges.txt")}
        files["vocab.json"].write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
        files["merges.txt"].write_text("".join(merge + "\n" for merge in merges), encoding="utf-8")
        return FSMTTokenizer(langs=[source_lang, target_lang], src_vocab_file=str(files["vocab.json"]),
                             tgt_vocab_file=str(files["vocab.json"]), merges_file=str(files["merges.txt"]))


def from_fairseq(folder: str):
    """(model, tokenizer) of a fairseq Transformer release folder, decoding as Ott et al. (2018) did."""
    folder = Path(folder)
    if not (folder / "model.pt").is_file():
        raise ValueError(f"{folder} has no model.pt (fairseq's release folder: model.pt, dict.SRC.txt, dict.TGT.txt, "
                         "bpecodes)")
    state = read_checkpoint(folder / "model.pt")
    args = state["args"]
    source_lang, target_lang = getattr(args, "source_lang", None), getattr(args, "target_lang", None)
    needed = [f"dict.{source_lang}.txt", f"dict.{target_lang}.txt", "bpecodes"]
    missing = [name for name in needed if not (folder / name).is_file()]
    if missing:
        raise ValueError(f"{folder} has no {', '.join(missing)} (its checkpoint: {source_lang}-{target_lang})")
    words = read_dictionary(folder / needed[0])
    if read_dictionary(folder / needed[1]) != words:
        raise ValueError("its source and target dictionaries differ; vaswani_hf has one joint vocabulary (§3.4)")
    config = fairseq_config(args, len(words))
    weights = fairseq_weights(state["model"])
    rows = {name: tuple(weights[name].shape) for name in ("model.encoder.embed_tokens.weight", "lm_head.weight")
            if name in weights}
    if any(shape[0] != len(words) for shape in rows.values()):
        raise ValueError(f"its dictionary has {len(words)} words but its embeddings {rows}")
    model = with_weights(config, weights)
    model.generation_config = GenerationConfig(
        num_beams=4, length_penalty=0.6, max_new_tokens=200, early_stopping=True,  # fairseq-generate --beam 4 --lenpen
        bos_token_id=0, pad_token_id=1, eos_token_id=2, decoder_start_token_id=2)  # 0.6 (max_len_b 200)
    model.generation_config._from_model_config = False
    return model.eval(), fsmt_tokenizer(words, folder / "bpecodes", source_lang, target_lang)


def fsmt_config(fsmt) -> VaswaniConfig:
    """The VaswaniConfig computing what `fsmt` (an FSMTConfig) computes but for the embeddings' tying, which its
    weights decide (`from_fsmt`); a ValueError names what has no counterpart here."""
    unsupported = [f"encoder_{name} != decoder_{name}" for name in ("ffn_dim", "attention_heads")
                   if getattr(fsmt, f"encoder_{name}") != getattr(fsmt, f"decoder_{name}")]
    if fsmt.src_vocab_size != fsmt.tgt_vocab_size:
        unsupported.append(f"vocabularies of {fsmt.src_vocab_size} and {fsmt.tgt_vocab_size} tokens")
    if fsmt.activation_function not in ("relu", "gelu"):
        unsupported.append(f"activation_function={fsmt.activation_function!r}")
    specials = {name: getattr(fsmt, name) for name in ("bos_token_id", "pad_token_id", "eos_token_id",
                                                        "decoder_start_token_id")}
    if any(specials[name] != FAIRSEQ_COMPUTATION[name] for name in specials):
        unsupported.append(f"special tokens {specials}")
    if unsupported:
        raise ValueError(f"this FSMT model has {', '.join(unsupported)}, which vaswani_hf does not compute")
    return VaswaniConfig(
        vocab_size=fsmt.src_vocab_size, d_model=fsmt.d_model, d_ff=fsmt.encoder_ffn_dim,
        num_heads=fsmt.encoder_attention_heads, num_layers=fsmt.encoder_layers, num_decoder_layers=fsmt.decoder_layers,
        dropout=fsmt.dropout, attention_dropout=fsmt.attention_dropout, activation_dropout=fsmt.activation_dropout,
        activation_function=fsmt.activation_function, max_position_embeddings=fsmt.max_position_embeddings,
        scale_embedding=fsmt.scale_embedding, **FAIRSEQ_COMPUTATION,
    )


EMBEDDINGS = ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight")


def from_fsmt(name_or_path: str):
    """(model, tokenizer) of an FSMT folder or Hub id, with the generation config it was published with."""
    from transformers import FSMTForConditionalGeneration

    config = fsmt_config(published_config(name_or_path, "fsmt", "an FSMT"))  # found before the weights are read
    tokenizer = AutoTokenizer.from_pretrained(name_or_path)
    if tokenizer.encoder != {token: i for i, token in tokenizer.decoder.items()}:  # FSMTTokenizer's vocabularies
        raise ValueError("its source and target vocabularies differ; vaswani_hf has one joint vocabulary (§3.4)")
    if len(tokenizer.encoder) != config.vocab_size:
        raise ValueError(f"its tokenizer has {len(tokenizer.encoder)} tokens but its embeddings {config.vocab_size} "
                         "rows")
    fsmt = FSMTForConditionalGeneration.from_pretrained(name_or_path, dtype=torch.float32)
    weights = fairseq_weights({name.removeprefix("model."): tensor for name, tensor in fsmt.state_dict().items()
                               if ".embed_positions." not in name})  # computed, not stored
    config.tie_word_embeddings = all(torch.equal(weights[EMBEDDINGS[0]], weights[name]) for name in EMBEDDINGS[1:])
    model = with_weights(config, weights)
    published_decoding(model, fsmt)
    return model.eval(), tokenizer


CONVERTERS = {"marian": from_marian, "fairseq": from_fairseq, "fsmt": from_fsmt}


def source_license(name_or_path: str) -> str | None:
    """The license the source's model card declares, if it has one where it can be read."""
    from huggingface_hub import ModelCard

    card = Path(name_or_path) / "README.md"
    try:
        return ModelCard.load(card if card.is_file() else name_or_path).data.license
    except Exception:  # noqa: BLE001 - no card, no network, no metadata: the card says the license is unknown
        return None


SOURCE_NAMES = {"marian": "Marian", "fairseq": "fairseq", "fsmt": "FSMT"}


def model_card(model, kind: str, name_or_path: str, license_: str | None = None) -> str:
    """README.md of the converted folder: where the weights come from, their license, size and deviations."""
    license_ = license_ or source_license(name_or_path)
    config = model.config
    metadata = {"library_name": "transformers", "tags": ["translation", "vaswani_hf", kind],
                **({"license": license_} if license_ else {}),
                **({} if Path(name_or_path).exists() else {"base_model": name_or_path})}
    front = "\n".join(f"{key}: {json.dumps(value)}" for key, value in metadata.items())
    deviations = [f"- {deviation}" for deviation in config.deviations()]
    return (
        f"---\n{front}\n---\n\n# {Path(name_or_path).name} in vaswani_hf\n\n"
        f"The weights of the {SOURCE_NAMES[kind]} model `{name_or_path}`, converted with `vaswani-convert {kind}`: "
        f"they are that model's, under its license ({license_ or 'not stated in its model card: see the source'}); "
        f"nothing was trained or changed.\n\n{config.num_layers} encoder and {config.num_decoder_layers} decoder "
        f"layers, d_model {config.d_model}, d_ff {config.d_ff}, {config.num_heads} heads, a vocabulary of "
        f"{config.vocab_size:,}; {model.num_parameters():,} parameters. The decoder starts from token "
        f"{config.decoder_start_token_id}.\n\nWhat it computes differently from the paper, each a config option "
        f"(off by default):\n\n" + "\n".join(deviations)
        + "\n\n`generation_config.json` holds the source's decoding; `vaswani-translate --alpha A` decodes the "
        "paper's way instead (beam search with the GNMT length penalty, §6.1).\n"
    )


def main(argv: list[str] | None = None) -> None:
    utf8_output()
    parser = argparse.ArgumentParser(prog="vaswani-convert", description=__doc__.splitlines()[0].split(": ", 1)[1])
    sources = parser.add_subparsers(dest="source", required=True)
    marian = sources.add_parser("marian", help="a MarianMTModel (the OPUS-MT models): folder or Hub id")
    marian.add_argument("model", help="a MarianMTModel folder or Hub repository id")
    fairseq = sources.add_parser("fairseq", help="a fairseq Transformer checkpoint folder, as fairseq releases it")
    fairseq.add_argument("model", help="the folder of model.pt, dict.SRC.txt, dict.TGT.txt and bpecodes")
    fsmt = sources.add_parser("fsmt", help="an FSMT model (transformers' port of fairseq's): folder or Hub id")
    fsmt.add_argument("model", help="an FSMT folder or Hub repository id")
    for source in (marian, fairseq, fsmt):
        source.add_argument("output", help="the folder to write (must not exist)")
        source.add_argument("--license", help="the weights' license, for the model card (default: what the source's "
                                              "own card declares; fairseq's release folders have none)")
    args = parser.parse_args(argv)

    refuse_blank_model(args.model)
    check_output_place(args.output)
    if Path(args.output).exists():
        raise SystemExit(f"error: {args.output} exists: give a folder that does not")
    check_packages(args.source)
    disable_progress_bar()
    try:
        model, tokenizer = CONVERTERS[args.source](args.model)
    except (OSError, ValueError, RuntimeError, SafetensorError) as error:  # missing, damaged, another kind
        raise SystemExit(f"error: cannot convert {args.model}: {str(error).strip().splitlines()[0]}") from None
    with written_whole(args.output) as partial:
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
        (partial / "README.md").write_text(model_card(model, args.source, args.model, args.license), encoding="utf-8")
    print(f"wrote {args.output}: vaswani-translate --model {args.output} translates with it")


if __name__ == "__main__":
    main()
