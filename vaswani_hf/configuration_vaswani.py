# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""Configuration of the Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

This file travels to the Hub beside the weights: it imports only transformers and the pipeline file, which the
config names under `custom_pipelines` (the relative import makes `save_pretrained` ship that file too).
"""

import copy

from transformers import PretrainedConfig
from transformers.utils.versions import require_version

from .pipeline_vaswani import CUSTOM_PIPELINES

# transformers 5.24 renamed the decoding cache, argument and output field, from `past_key_values` to `cache`: the
# model speaks the new name (and takes the old one, as transformers' own models do). An older one is refused here,
# in the file that loads first (AutoConfig's), whose imports transformers 4 still has: the model's file would fail
# first on an import that names nothing of the version.
require_version("transformers>=5.24")

# The paper's architecture (§3) as config values, and what any other value means: the one list of deviations, which
# `VaswaniConfig.deviations()` reads for the model cards of a run (training/hub.py) and of a converted model.
PAPER_ARCHITECTURE = {
    "normalize_before": (False, "pre-LN sub-layers x + Dropout(Sublayer(LayerNorm(x))) instead of post-LN"),
    "tie_word_embeddings": (True, "untied source embedding, target embedding and pre-softmax projection"),
    "position_embedding": ("sinusoidal", "learned position embeddings instead of sinusoids (Table 3 row E)"),
    "scale_embedding": (True, "embeddings not multiplied by sqrt(d_model)"),
    "attention_dropout": (0.0, "dropout on the attention weights"),
    "activation_dropout": (0.0, "dropout after the feed-forward ReLU"),
    "activation_function": ("relu", "another feed-forward non-linearity than ReLU"),
    "add_final_logits_bias": (False, "a fixed bias added to the logits (Marian's)"),
    "position_encoding_layout": ("interleaved", "the sinusoids laid out as all sines, then all cosines"),
    "position_encoding_frequencies": ("paper", "fairseq's sinusoid frequencies"),
    "position_offset": (0, "positions counted from an offset (fairseq's)"),
    "layer_norm_eps": (1e-6, "another LayerNorm epsilon than tensor2tensor's (the paper names none)"),
}


class VaswaniConfig(PretrainedConfig):
    r"""
    Configuration of [`VaswaniModel`] and [`VaswaniForConditionalGeneration`], in the paper's symbols.
    The defaults are the paper's base model (§3, Table 3 row "base"); `VaswaniConfig.big()` gives the big one.

    Args:
        vocab_size (`int`, defaults to 37000):
            Size of the joint source-target vocabulary (§5.1: shared BPE of about 37,000 for WMT EN-DE).
        d_model (`int`, defaults to 512):
            Width of every sub-layer output and of the embeddings (§3.1).
        d_ff (`int`, defaults to 2048):
            Inner width of the position-wise feed-forward network (§3.3).
        num_heads (`int`, defaults to 8):
            Number of attention heads h (§3.2.2).
        d_k (`int`, *optional*):
            Width of each head's queries and keys; defaults to d_model / h (§3.2.2; Table 3 row B varies it).
        d_v (`int`, *optional*):
            Width of each head's values; defaults to d_model / h.
        num_layers (`int`, defaults to 6):
            N, the number of encoder layers (§3.1).
        num_decoder_layers (`int`, *optional*):
            Number of decoder layers; defaults to `num_layers`.
        dropout (`float`, defaults to 0.1):
            P_drop, applied to every sub-layer output and to the embedding + position sums (§5.4).
        attention_dropout (`float`, defaults to 0.0):
            Dropout on attention weights; 0 in the authors' code at paper time.
        activation_dropout (`float`, defaults to 0.0):
            Dropout after the feed-forward ReLU; 0 in the authors' code at paper time.
        activation_function (`str`, defaults to `"relu"`):
            The feed-forward network's non-linearity: `"relu"` (§3.3), or `"swish"` or `"gelu"` (transformers'
            `ACT2FN`). A deviation, for converted models (OPUS-MT's Marian models use swish).
        layer_norm_eps (`float`, defaults to 1e-6):
            LayerNorm epsilon of the authors' code.
        position_embedding (`str`, defaults to `"sinusoidal"`):
            `"sinusoidal"`: the fixed §3.5 encoding, computed on the fly, with no length limit.
            `"learned"`: learned position embeddings (Table 3 row E), up to `max_position_embeddings` positions.
        position_encoding_layout (`str`, defaults to `"interleaved"`):
            The sinusoidal table's layout: `"interleaved"` (§3.5: sin, cos, sin, cos, ...) or `"halves"` (all sines,
            then all cosines: tensor2tensor, fairseq, Marian). A deviation, for converted models.
        position_encoding_frequencies (`str`, defaults to `"paper"`):
            `"paper"`: pos / 10000^(2i/d_model) (§3.5); `"fairseq"`: pos / 10000^(i/(d_model/2 - 1)). A deviation,
            for converted models.
        position_offset (`int`, defaults to 0):
            The sinusoidal encoding's first position (fairseq's: its padding index + 1). A deviation, for converted
            models.
        max_position_embeddings (`int`, defaults to 1024):
            Number of learned positions; unused by the sinusoidal encoding.
        scale_embedding (`bool`, defaults to `True`):
            Multiply the embeddings by sqrt(d_model) (§3.4).
        tie_word_embeddings (`bool`, defaults to `True`):
            One matrix for the source embedding, the target embedding and the pre-softmax projection (§3.4).
            `False` gives three independent matrices.
        add_final_logits_bias (`bool`, defaults to `False`):
            Add a fixed bias vector to the logits (the buffer `final_logits_bias`, saved with the weights and not
            trained), as Marian does. A deviation, for converted models; the paper's projection has no bias (§3.4).
        normalize_before (`bool`, defaults to `False`):
            `False` is the paper's post-LN, `LayerNorm(x + Dropout(Sublayer(x)))` (§3.1). `True` is the pre-LN
            variant of later tensor2tensor releases, `x + Dropout(Sublayer(LayerNorm(x)))` with a final LayerNorm
            on each stack: a deviation from the paper, off by default.
        pad_token_id, bos_token_id, eos_token_id, decoder_start_token_id (`int`):
            Special token ids. The decoder starts from `decoder_start_token_id` (by default the BOS token). Only
            `bos_token_id` and `eos_token_id` may be None (the paper's search needs one EOS id).
        custom_pipelines (`dict`, *optional*):
            Pipelines that `pipeline()` loads from the model folder; by default the `translation` task of
            `pipeline_vaswani.py` (transformers 5 has none).

    Every row of Table 3 is one call, e.g. row (B) `VaswaniConfig(d_k=16)`, row (C) `VaswaniConfig(num_layers=2)`,
    row (E) `VaswaniConfig(position_embedding="learned")`.
    """

    model_type = "vaswani"
    keys_to_ignore_at_inference = ["cache"]
    attribute_map = {
        "hidden_size": "d_model",
        "num_attention_heads": "num_heads",
        "num_hidden_layers": "num_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    d_k: int | None = None
    d_v: int | None = None
    num_layers: int = 6
    num_decoder_layers: int | None = None
    dropout: float | int = 0.1
    attention_dropout: float | int = 0.0
    activation_dropout: float | int = 0.0
    activation_function: str = "relu"
    layer_norm_eps: float = 1e-6
    position_embedding: str = "sinusoidal"
    position_encoding_layout: str = "interleaved"
    position_encoding_frequencies: str = "paper"
    position_offset: int = 0
    max_position_embeddings: int = 1024
    scale_embedding: bool = True
    tie_word_embeddings: bool = True
    add_final_logits_bias: bool = False
    normalize_before: bool = False
    use_cache: bool = True
    is_encoder_decoder: bool = True
    pad_token_id: int = 0
    bos_token_id: int | None = 1
    eos_token_id: int | list[int] | None = 2
    decoder_start_token_id: int = 1
    custom_pipelines: dict | None = None

    def __post_init__(self, **kwargs):
        if self.custom_pipelines is None:
            self.custom_pipelines = copy.deepcopy(CUSTOM_PIPELINES)
        for generic_name, name in self.attribute_map.items():  # hidden_size=... etc. count before defaults derive
            if generic_name in kwargs:
                setattr(self, name, kwargs.pop(generic_name))
        for name in ("vocab_size", "d_model", "d_ff", "num_heads", "num_layers"):
            _check_positive(name, getattr(self, name))
        if self.num_decoder_layers is None:
            self.num_decoder_layers = self.num_layers
        _check_positive("num_decoder_layers", self.num_decoder_layers)
        for name in ("d_k", "d_v"):
            if getattr(self, name) is None:
                if self.d_model % self.num_heads:
                    raise ValueError(
                        f"VaswaniConfig: d_model={self.d_model} is not divisible by num_heads={self.num_heads}; "
                        f"choose another num_heads or pass {name} explicitly"
                    )
                setattr(self, name, self.d_model // self.num_heads)
            _check_positive(name, getattr(self, name))
        for name in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"VaswaniConfig: {name}={value} must be in [0, 1)")
        if self.position_embedding not in ("sinusoidal", "learned"):
            raise ValueError(
                f"VaswaniConfig: position_embedding={self.position_embedding!r} must be 'sinusoidal' or 'learned'"
            )
        if self.position_embedding == "sinusoidal" and self.d_model % 2:
            raise ValueError(
                f"VaswaniConfig: the sinusoidal encoding needs an even d_model, got d_model={self.d_model}"
            )
        for name, allowed in (("activation_function", ("relu", "swish", "gelu")),
                              ("position_encoding_layout", ("interleaved", "halves")),
                              ("position_encoding_frequencies", ("paper", "fairseq"))):
            if getattr(self, name) not in allowed:
                raise ValueError(f"VaswaniConfig: {name}={getattr(self, name)!r} must be one of {allowed}")
        if self.position_encoding_frequencies == "fairseq" and self.d_model < 4:
            raise ValueError(f"VaswaniConfig: fairseq's frequencies need d_model >= 4, got d_model={self.d_model}")
        if not (isinstance(self.position_offset, int) and self.position_offset >= 0):
            raise ValueError(f"VaswaniConfig: position_offset={self.position_offset!r} must be an integer >= 0")
        _check_positive("max_position_embeddings", self.max_position_embeddings)
        if not self.layer_norm_eps > 0:
            raise ValueError(f"VaswaniConfig: layer_norm_eps={self.layer_norm_eps} must be > 0")
        for name, use in (("pad_token_id", "fills batches and is left out of the loss"),
                          ("decoder_start_token_id", "is the decoder's first input")):
            if getattr(self, name) is None:
                raise ValueError(f"VaswaniConfig: {name} is None: the model needs one, it {use}")
        for name in ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            ids = value if isinstance(value, list) else [value]  # transformers allows several EOS ids
            if any(i is not None and not 0 <= i < self.vocab_size for i in ids):
                raise ValueError(f"VaswaniConfig: {name}={value} is outside the vocabulary [0, {self.vocab_size})")
        super().__post_init__(**kwargs)

    def get_text_config(self, decoder=None, encoder=None) -> "VaswaniConfig":
        """The decoder's view (`decoder=True`, used by transformers to size the KV cache) has
        `num_decoder_layers` layers. transformers 5.24-5.25 hand it back as a copy; another version might not."""
        text_config = super().get_text_config(decoder=decoder, encoder=encoder)
        if decoder and not encoder:
            text_config = copy.copy(text_config) if text_config is self else text_config
            text_config.num_layers = self.num_decoder_layers
        return text_config

    def deviations(self) -> list[str]:
        """Where this configuration computes differently from the paper, one line each (`PAPER_ARCHITECTURE`)."""
        return [f"{text} (`{name}={getattr(self, name)!r}`)" for name, (paper, text) in PAPER_ARCHITECTURE.items()
                if getattr(self, name) != paper]

    @classmethod
    def base(cls, **overrides) -> "VaswaniConfig":
        """The paper's base model (Table 3): N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1; 63.1M parameters
        with a 37,000 vocabulary."""
        return cls(**overrides)

    @classmethod
    def big(cls, **overrides) -> "VaswaniConfig":
        """The paper's big model (Table 3): N=6, d_model=1024, d_ff=4096, h=16, P_drop=0.3 (0.1 for EN-FR, §6.1)."""
        return cls(**{"d_model": 1024, "d_ff": 4096, "num_heads": 16, "dropout": 0.3, **overrides})


def _check_positive(name: str, value) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"VaswaniConfig: {name}={value!r} must be a positive integer")


__all__ = ["VaswaniConfig"]
