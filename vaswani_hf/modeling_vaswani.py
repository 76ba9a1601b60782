# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""The Transformer of "Attention Is All You Need" (Vaswani et al., 2017, arXiv:1706.03762), as published.

This file travels to the Hub beside the weights: it imports only torch, transformers and its neighbours — the
configuration, `checks.py` (one-line errors for bad input) and `gnmt.py` (the paper's beam search). Its layers are
torch's and transformers' own, as in Marian.

Shape letters used in comments: B batch, T target (query) length, S source (key) length, h heads,
d_k / d_v head widths, D = d_model, V vocabulary.

Deviations from the paper: none by default. The architecture's are config options, listed once with what each
means in `configuration_vaswani.PAPER_ARCHITECTURE` (pre-LN, untied embeddings, learned positions, the attention and
activation dropouts, and the options of converted models); `VaswaniConfig.deviations()` names a config's, and the
model cards print them. Beside the architecture:
  * Decoding: a model built from a bare config decodes as every transformers model does (greedy, the library's
    defaults). A saved model's `generation_config.json` asks for the paper's (`training/run.py` writes beam 4 and
    the run's `gnmt_alpha`), and `generate()` then runs the GNMT search of `gnmt.py`, whose length penalty
    ((5 + |Y|) / 6)^alpha is the paper's; transformers' `length_penalty` divides by |Y|^alpha instead.
  * Transforms of a model object, not in these files: int8 linear layers (`quantize_int8`, `--int8`; the paper
    decodes in float32), and for speed `fast_cpu` (beams sharing their source's keys and values, a lean decoder step,
    packed weights) and `fast_gpu` (fused projections), each swapping in modules or methods of its own: the same
    products rounded differently, on by default in our tools.
"""

import math
from collections.abc import Callable

import torch
from torch import nn
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.cache_utils import Cache, DynamicCache, EncoderDecoderCache
from transformers.generation import GenerationMixin
from transformers.masking_utils import create_bidirectional_mask, create_causal_mask
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutput,
    BaseModelOutputWithPastAndCrossAttentions,
    Seq2SeqLMOutput,
    Seq2SeqModelOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS, PreTrainedModel
from transformers.utils import can_return_tuple, is_torchdynamo_compiling, logging
from transformers.utils.deprecation import deprecate_kwarg
from transformers.utils.generic import merge_with_config_defaults
from transformers.utils.output_capturing import OutputRecorder, capture_outputs

from .checks import check_mask, check_token_ids
from .configuration_vaswani import VaswaniConfig
from .gnmt import paper_decoding

logger = logging.get_logger(__name__)


def shift_tokens_right(labels: torch.Tensor, pad_token_id: int, decoder_start_token_id: int) -> torch.Tensor:
    """Decoder inputs from labels: "the output embeddings are offset by one position" (§3.1). -100 becomes PAD."""
    shifted = labels.new_full(labels.shape, pad_token_id)
    shifted[:, 1:] = labels[:, :-1]
    shifted[:, 0] = decoder_start_token_id
    return shifted.masked_fill(shifted == -100, pad_token_id)


def sinusoidal_position_encoding(
    positions: torch.Tensor, d_model: int, layout: str = "interleaved", frequencies: str = "paper"
) -> torch.Tensor:
    """§3.5: PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)).

    Interleaved sin/cos, computed in float32 for any positions (no length limit, nothing stored).
    positions: (T,) or (B, T) integers -> (..., D) float32. For converted models (deviations, off by default):
    `layout="halves"` puts the D/2 sines first and the cosines after them (tensor2tensor, fairseq, Marian), and
    `frequencies="fairseq"` takes pos / 10000^(i/(D/2 - 1)) for the i-th pair (fairseq).
    """
    half = d_model // 2
    steps = half - 1 if frequencies == "fairseq" else half
    inv_freq = torch.exp(
        torch.arange(half, device=positions.device, dtype=torch.float32) * (-math.log(10000.0) / steps)
    )  # (D/2,)
    angles = positions.to(torch.float32).unsqueeze(-1) * inv_freq  # (..., D/2)
    if layout == "halves":
        return torch.cat((angles.sin(), angles.cos()), dim=-1)  # (..., D): sin, ..., sin, cos, ..., cos
    return torch.stack((angles.sin(), angles.cos()), dim=-1).flatten(-2)  # (..., D): sin, cos, sin, cos, ...


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """§3.2.1 Scaled Dot-Product Attention: softmax(Q K^T / sqrt(d_k)) V, with an additive mask or a boolean one
    (True: attend), as transformers builds them for the eager and the SDPA kernels."""
    scores = torch.matmul(query, key.transpose(2, 3)) * scaling  # (B, h, T, S)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(~attention_mask, torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, T, h, d_v)
    return output, weights


class VaswaniAttention(nn.Module):
    """§3.2.2 Multi-Head Attention: Concat(head_1, ..., head_h) W^O with head_i = Attention(Q W_i^Q, K W_i^K, V W_i^V).

    Used three ways (§3.2.3): encoder self-attention, masked decoder self-attention (`is_causal=True`), and
    encoder-decoder attention (`key_value_states` = encoder output). The projections carry biases, as in the
    authors' code. The kernel is chosen by transformers' attention interface ("sdpa" by default, "eager", ...).
    """

    def __init__(self, config: VaswaniConfig, is_causal: bool = False, layer_idx: int | None = None):
        super().__init__()
        self.config = config
        self.num_heads = config.num_heads
        self.d_k = config.d_k
        self.d_v = config.d_v
        self.scaling = config.d_k**-0.5
        self.dropout = config.attention_dropout
        self.is_causal = is_causal  # read by the SDPA interface: encoder and cross attention must say False
        self.layer_idx = layer_idx
        self.q_proj = nn.Linear(config.d_model, config.num_heads * config.d_k)
        self.k_proj = nn.Linear(config.d_model, config.num_heads * config.d_k)
        self.v_proj = nn.Linear(config.d_model, config.num_heads * config.d_v)
        self.out_proj = nn.Linear(config.num_heads * config.d_v, config.d_model)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_value_states: torch.Tensor | None = None,
        cache: Cache | None = None,
        attention_mask: torch.Tensor | None = None,
        **kwargs,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, length = hidden_states.shape[:2]
        is_cross = key_value_states is not None
        is_encoder_decoder_cache = isinstance(cache, EncoderDecoderCache)
        if is_cross:
            own_cache = cache.cross_attention_cache if is_encoder_decoder_cache else None
        else:
            own_cache = cache.self_attention_cache if is_encoder_decoder_cache else cache

        if is_cross and own_cache is not None and cache.is_updated.get(self.layer_idx):
            # The encoder output does not change during decoding: its keys and values are computed once.
            query = self.q_proj(hidden_states)
            key, value = own_cache.layers[self.layer_idx].keys, own_cache.layers[self.layer_idx].values
        else:
            source = key_value_states if is_cross else hidden_states
            query = self.q_proj(hidden_states)
            key = self.k_proj(source).unflatten(-1, (-1, self.d_k)).transpose(1, 2)  # (B, h, S, d_k)
            value = self.v_proj(source).unflatten(-1, (-1, self.d_v)).transpose(1, 2)  # (B, h, S, d_v)
            if own_cache is not None:
                key, value = own_cache.update(key, value, self.layer_idx)
                if is_cross:
                    cache.is_updated[self.layer_idx] = True
        query = query.view(batch_size, length, -1, self.d_k).transpose(1, 2)  # (B, h, T, d_k)
        attention_interface: Callable = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation,
                                                                              eager_attention_forward)
        output, weights = attention_interface(self, query, key, value, attention_mask, scaling=self.scaling,
                                              dropout=self.dropout if self.training else 0.0, **kwargs)
        output = output.reshape(batch_size, length, -1).contiguous()  # (B, T, h * d_v)
        return self.out_proj(output), weights


class VaswaniLayer(GradientCheckpointingLayer):
    """What encoder and decoder layers share: "Add & Norm" around each sub-layer (§3.1) and the FFN (§3.3).

    Post-LN (the paper): LayerNorm(x + Dropout(Sublayer(x))). Pre-LN (`normalize_before`, a deviation):
    x + Dropout(Sublayer(LayerNorm(x))).
    """

    def __init__(self, config: VaswaniConfig):
        super().__init__()
        self.normalize_before = config.normalize_before
        self.dropout = nn.Dropout(config.dropout)  # P_drop (§5.4)
        self.activation_dropout = nn.Dropout(config.activation_dropout)
        self.fc1 = nn.Linear(config.d_model, config.d_ff)
        self.fc2 = nn.Linear(config.d_ff, config.d_model)
        self.activation_fn = ACT2FN[config.activation_function]  # ReLU (§3.3) unless converted from elsewhere
        self.final_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def sublayer_input(self, hidden_states: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        return norm(hidden_states) if self.normalize_before else hidden_states

    def add_and_norm(self, residual: torch.Tensor, output: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
        """§5.4: dropout on the sub-layer output before it is added to the input and normalized."""
        output = self.dropout(output)
        return residual + output if self.normalize_before else norm(residual + output)

    def feed_forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """§3.3: FFN(x) = max(0, x W_1 + b_1) W_2 + b_2, as a residual sub-layer."""
        residual = hidden_states
        hidden_states = self.activation_fn(self.fc1(self.sublayer_input(hidden_states, self.final_layer_norm)))
        hidden_states = self.activation_dropout(hidden_states)
        return self.add_and_norm(residual, self.fc2(hidden_states), self.final_layer_norm)


class VaswaniEncoderLayer(VaswaniLayer):
    """§3.1 Encoder layer: multi-head self-attention over the whole source, then the FFN."""

    def __init__(self, config: VaswaniConfig, layer_idx: int | None = None):
        super().__init__(config)
        self.self_attn = VaswaniAttention(config, is_causal=False, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        residual = hidden_states
        hidden_states, _ = self.self_attn(
            self.sublayer_input(hidden_states, self.self_attn_layer_norm), attention_mask=attention_mask, **kwargs
        )
        hidden_states = self.add_and_norm(residual, hidden_states, self.self_attn_layer_norm)
        return self.feed_forward(hidden_states)


class VaswaniDecoderLayer(VaswaniLayer):
    """§3.1 Decoder layer: masked self-attention, encoder-decoder attention, then the FFN."""

    def __init__(self, config: VaswaniConfig, layer_idx: int | None = None):
        super().__init__(config)
        self.self_attn = VaswaniAttention(config, is_causal=True, layer_idx=layer_idx)
        self.self_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)
        self.encoder_attn = VaswaniAttention(config, is_causal=False, layer_idx=layer_idx)
        self.encoder_attn_layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        use_cache: bool | None = True,
        **kwargs,
    ) -> torch.Tensor:
        residual = hidden_states
        hidden_states, _ = self.self_attn(self.sublayer_input(hidden_states, self.self_attn_layer_norm), cache=cache,
                                          attention_mask=attention_mask, **kwargs)
        hidden_states = self.add_and_norm(residual, hidden_states, self.self_attn_layer_norm)

        if encoder_hidden_states is not None:
            residual = hidden_states
            hidden_states, _ = self.encoder_attn(self.sublayer_input(hidden_states, self.encoder_attn_layer_norm),
                                                 key_value_states=encoder_hidden_states, cache=cache,
                                                 attention_mask=encoder_attention_mask, **kwargs)
            hidden_states = self.add_and_norm(residual, hidden_states, self.encoder_attn_layer_norm)

        return self.feed_forward(hidden_states)


class VaswaniPreTrainedModel(PreTrainedModel):
    """What all the classes below share: the configuration and the authors' initialization (§3.4 for the
    embeddings), and transformers' switches (SDPA, gradient checkpointing, compilation)."""

    config: VaswaniConfig
    config_class = VaswaniConfig
    base_model_prefix = "model"
    supports_gradient_checkpointing = True
    _no_split_modules = ["VaswaniEncoderLayer", "VaswaniDecoderLayer"]
    _supports_sdpa = True
    _supports_flash_attn = True
    _can_compile_fullgraph = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module):
        """The authors' initialization: Glorot-uniform kernels, zero biases, embeddings N(0, d_model^-0.5) with the
        PAD row zero, LayerNorm gain 1 and bias 0."""
        std = self.config.d_model**-0.5
        if isinstance(module, nn.Linear) and module is getattr(self, "lm_head", None):
            if not self.config.tie_word_embeddings:  # untied pre-softmax projection: like tensor2tensor's softmax
                init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.Linear):
            init.xavier_uniform_(module.weight)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.padding_idx is not None and not getattr(module.weight, "_is_hf_initialized", False):
                init.zeros_(module.weight[module.padding_idx])
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        if getattr(module, "final_logits_bias", None) is not None:
            init.zeros_(module.final_logits_bias)

    def _resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None, mean_resizing=True):
        embeddings = super()._resize_token_embeddings(new_num_tokens, pad_to_multiple_of, mean_resizing)
        decoder = getattr(self.base_model, "decoder", None)
        if decoder is not None and decoder.embed_tokens.weight.shape[0] != embeddings.weight.shape[0]:
            # Untied target embedding: resize it too, so that source and target vocabularies stay one.
            decoder.embed_tokens = self._get_resized_embeddings(
                decoder.embed_tokens, embeddings.weight.shape[0], mean_resizing=mean_resizing
            )
        bias = getattr(self, "final_logits_bias", None)
        if bias is not None:  # new tokens get no bias, as in Marian
            rows = embeddings.weight.shape[0]
            self.final_logits_bias = nn.Buffer(nn.functional.pad(bias[:, :rows], (0, max(0, rows - bias.shape[1]))))
        return embeddings


class VaswaniStack(VaswaniPreTrainedModel):
    """What encoder and decoder stacks share (§3.1, §3.4, §3.5): token embedding × sqrt(d_model) plus positions,
    dropout on the sum, N layers, and — in pre-LN mode only — a final LayerNorm."""

    def __init__(self, config: VaswaniConfig, layers: list[VaswaniLayer]):
        super().__init__(config)
        self.embed_scale = math.sqrt(config.d_model) if config.scale_embedding else 1.0
        self.embed_tokens = nn.Embedding(config.vocab_size, config.d_model, padding_idx=config.pad_token_id)
        learned = config.position_embedding == "learned"  # a deviation, for converted models
        self.embed_positions = nn.Embedding(config.max_position_embeddings, config.d_model) if learned else None
        self.dropout = nn.Dropout(config.dropout)  # P_drop on the embeddings' sums (§5.4)
        self.layers = nn.ModuleList(layers)
        self.layer_norm = nn.LayerNorm(config.d_model, eps=config.layer_norm_eps) if config.normalize_before else None
        self.gradient_checkpointing = False

    def embed(
        self, input_ids: torch.Tensor | None, inputs_embeds: torch.Tensor | None, past_length: int, name: str
    ) -> torch.Tensor:
        """Scaled token embeddings plus position encodings, with dropout (§3.4, §3.5, §5.4).

        `inputs_embeds` are rows of the embedding matrix, as `get_input_embeddings()` returns them: they are
        scaled here like the looked-up ones.
        """
        if (input_ids is None) == (inputs_embeds is None):
            raise ValueError(f"Give exactly one of {name} and the matching inputs_embeds")
        if inputs_embeds is None:
            # Values are checked where a sequence begins: later decoding steps feed back the model's own choices.
            begins = isinstance(past_length, int) and past_length == 0  # a static cache's length is a tensor
            check_token_ids(input_ids, self.config.vocab_size, name, values=begins)
            inputs_embeds = self.embed_tokens(input_ids)
        elif inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != self.config.d_model or inputs_embeds.shape[1] == 0:
            raise ValueError(f"inputs_embeds must have shape (batch, length >= 1, d_model={self.config.d_model}), "
                             f"got {tuple(inputs_embeds.shape)}")
        length = inputs_embeds.shape[1]
        # A fixed-size arange plus the offset, which a static cache gives as a tensor under torch.compile.
        positions = torch.arange(length, device=inputs_embeds.device) + past_length  # (T,)
        if self.embed_positions is None:
            position_encoding = sinusoidal_position_encoding(
                positions + self.config.position_offset, self.config.d_model, self.config.position_encoding_layout,
                self.config.position_encoding_frequencies,
            ).to(inputs_embeds.dtype)
        else:
            if past_length + length > self.config.max_position_embeddings and not is_torchdynamo_compiling():
                raise ValueError(f"Sequence of {past_length + length} positions is longer than the "
                                 f"max_position_embeddings={self.config.max_position_embeddings} learned ones")
            position_encoding = self.embed_positions(positions)
        hidden_states = inputs_embeds * self.embed_scale + position_encoding  # (B, T, D)
        return self.dropout(hidden_states)

    def finish(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return hidden_states if self.layer_norm is None else self.layer_norm(hidden_states)


class VaswaniEncoder(VaswaniStack):
    """§3.1 Encoder: a stack of N identical layers over the embedded source."""

    _can_record_outputs = {"hidden_states": VaswaniEncoderLayer, "attentions": VaswaniAttention}

    def __init__(self, config: VaswaniConfig):
        super().__init__(config, [VaswaniEncoderLayer(config, layer_idx=i) for i in range(config.num_layers)])
        self.post_init()

    @capture_outputs
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> BaseModelOutput:
        hidden_states = self.embed(input_ids, inputs_embeds, past_length=0, name="input_ids")
        check_mask(attention_mask, *hidden_states.shape[:2], "attention_mask", "input_ids")
        attention_mask = create_bidirectional_mask(config=self.config, inputs_embeds=hidden_states,
                                                   attention_mask=attention_mask)
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask, **kwargs)
        return BaseModelOutput(last_hidden_state=self.finish(hidden_states))


class VaswaniDecoder(VaswaniStack):
    """§3.1 Decoder: a stack of N identical layers; position i attends to target positions <= i and to the
    whole encoder output."""

    _can_record_outputs = {
        "hidden_states": OutputRecorder(VaswaniDecoderLayer, num_hidden_layers_key="num_decoder_layers"),
        "attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="self_attn"),
        "cross_attentions": OutputRecorder(VaswaniAttention, index=1, layer_name="encoder_attn"),
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config, [VaswaniDecoderLayer(config, layer_idx=i) for i in range(config.num_decoder_layers)])
        self.post_init()

    @merge_with_config_defaults
    @capture_outputs
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        encoder_hidden_states: torch.Tensor | None = None,
        encoder_attention_mask: torch.Tensor | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> BaseModelOutputWithPastAndCrossAttentions:
        if use_cache and cache is None:
            decoder_config = self.config.get_text_config(decoder=True)
            cache = EncoderDecoderCache(DynamicCache(config=decoder_config), DynamicCache(config=decoder_config))
        past_length = cache.get_seq_length() if cache is not None else 0

        hidden_states = self.embed(input_ids, inputs_embeds, past_length, name="decoder_input_ids")
        batch_size, length = hidden_states.shape[:2]
        check_mask(attention_mask, batch_size, past_length + length, "decoder_attention_mask", "the decoder")
        if encoder_hidden_states is not None:
            sources = encoder_hidden_states.shape[:2]
            if sources[0] != batch_size:
                raise ValueError(f"the decoder has {batch_size} rows but the encoder output {sources[0]}: give one "
                                 "encoder row per decoder row")
            check_mask(encoder_attention_mask, *sources, "attention_mask", "the source")

        self_attention_cache = cache.self_attention_cache if isinstance(cache, EncoderDecoderCache) else cache
        causal_mask = create_causal_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=attention_mask, cache=self_attention_cache
        )
        encoder_attention_mask = create_bidirectional_mask(
            config=self.config, inputs_embeds=hidden_states, attention_mask=encoder_attention_mask,
            encoder_hidden_states=encoder_hidden_states,
        )
        for layer in self.layers:  # encoder_hidden_states positional, for gradient checkpointing
            hidden_states = layer(
                hidden_states, causal_mask, encoder_hidden_states, encoder_attention_mask=encoder_attention_mask,
                cache=cache, use_cache=use_cache, **kwargs
            )
        return BaseModelOutputWithPastAndCrossAttentions(last_hidden_state=self.finish(hidden_states), cache=cache)


class VaswaniModel(VaswaniPreTrainedModel):
    """The bare encoder-decoder (§3, Figure 1) returning the decoder's last hidden states."""

    # §3.4: "we share the same weight matrix between the two embedding layers" (when tie_word_embeddings).
    _tied_weights_keys = {"decoder.embed_tokens.weight": "encoder.embed_tokens.weight"}

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.encoder = VaswaniEncoder(config)
        self.decoder = VaswaniDecoder(config)
        self.post_init()

    def get_input_embeddings(self) -> nn.Embedding:
        return self.encoder.embed_tokens

    def set_input_embeddings(self, value: nn.Embedding):
        self.encoder.embed_tokens = value
        if self.config.tie_word_embeddings:
            self.decoder.embed_tokens = value

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqModelOutput:
        r"""
        input_ids, attention_mask (`(batch_size, source_length)`): source token ids; 1 for tokens, 0 for padding.
        decoder_input_ids (`(batch_size, target_length)`): target ids shifted right, starting with
            `config.decoder_start_token_id` (`shift_tokens_right`).
        decoder_attention_mask (`(batch_size, target_length)`): 1 for tokens, 0 for padding.
        """
        if encoder_outputs is None:
            encoder_outputs = self.encoder(input_ids=input_ids, attention_mask=attention_mask,
                                           inputs_embeds=inputs_embeds, **kwargs)
        elif not isinstance(encoder_outputs, BaseModelOutput):  # (last_hidden_state, hidden_states, attentions)
            encoder_outputs = BaseModelOutput(*encoder_outputs)
        decoder_outputs = self.decoder(
            input_ids=decoder_input_ids, attention_mask=decoder_attention_mask, inputs_embeds=decoder_inputs_embeds,
            encoder_hidden_states=encoder_outputs.last_hidden_state, encoder_attention_mask=attention_mask,
            cache=cache, use_cache=use_cache, **kwargs,
        )
        return Seq2SeqModelOutput(
            last_hidden_state=decoder_outputs.last_hidden_state,
            cache=decoder_outputs.cache,
            decoder_hidden_states=decoder_outputs.hidden_states,
            decoder_attentions=decoder_outputs.attentions,
            cross_attentions=decoder_outputs.cross_attentions,
            encoder_last_hidden_state=encoder_outputs.last_hidden_state,
            encoder_hidden_states=encoder_outputs.hidden_states,
            encoder_attentions=encoder_outputs.attentions,
        )


class VaswaniForConditionalGeneration(VaswaniPreTrainedModel, GenerationMixin):
    """The Transformer with its pre-softmax projection (§3.4): logits = h E^T, no output bias.

    `labels` give a cross-entropy loss averaged over the non-pad target tokens (-100 and PAD are ignored), or
    summed and divided by `num_items_in_batch` when the Trainer passes it. Label smoothing (§5.4) belongs to the
    training loop (`Seq2SeqTrainingArguments.label_smoothing_factor` or training/).
    """

    _tied_weights_keys = {
        "lm_head.weight": "model.encoder.embed_tokens.weight",
        "model.decoder.embed_tokens.weight": "model.encoder.embed_tokens.weight",
    }

    def __init__(self, config: VaswaniConfig):
        super().__init__(config)
        self.model = VaswaniModel(config)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.add_final_logits_bias:  # Marian's fixed output bias (a deviation, for converted models)
            self.final_logits_bias = nn.Buffer(torch.zeros(1, config.vocab_size))
        self.post_init()

    @can_return_tuple
    @deprecate_kwarg("past_key_values", "5.40.0", new_name="cache")
    def forward(
        self,
        input_ids: torch.LongTensor | None = None,
        attention_mask: torch.Tensor | None = None,
        decoder_input_ids: torch.LongTensor | None = None,
        decoder_attention_mask: torch.Tensor | None = None,
        encoder_outputs: tuple[torch.Tensor] | BaseModelOutput | None = None,
        cache: Cache | None = None,
        inputs_embeds: torch.Tensor | None = None,
        decoder_inputs_embeds: torch.Tensor | None = None,
        labels: torch.LongTensor | None = None,
        use_cache: bool | None = None,
        **kwargs,
    ) -> Seq2SeqLMOutput:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, target_length)`): target ids ending with EOS; -100 (and
            PAD) positions are ignored. Without `decoder_input_ids`, these are `shift_tokens_right(labels)`.
        """
        num_items_in_batch = kwargs.pop("num_items_in_batch", None)
        if labels is not None:
            check_token_ids(labels, self.config.vocab_size, "labels", values=False)  # the loss reads the values
            use_cache = False
            if decoder_input_ids is None and decoder_inputs_embeds is None:
                decoder_input_ids = self.prepare_decoder_input_ids_from_labels(labels)
        outputs: Seq2SeqModelOutput = self.model(
            input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, encoder_outputs=encoder_outputs,
            decoder_input_ids=decoder_input_ids, decoder_attention_mask=decoder_attention_mask,
            decoder_inputs_embeds=decoder_inputs_embeds, cache=cache, use_cache=use_cache, **kwargs,
        )
        logits = self.lm_head(outputs.last_hidden_state)  # (B, T, V)
        if self.config.add_final_logits_bias:
            logits = logits + self.final_logits_bias
        loss = None if labels is None else self.seq2seq_loss(logits, labels, num_items_in_batch)
        # The model's outputs, with the logits in place of its last hidden state.
        rest = {key: value for key, value in outputs.items() if key != "last_hidden_state"}
        return Seq2SeqLMOutput(loss=loss, logits=logits, **rest)

    def seq2seq_loss(
        self, logits: torch.Tensor, labels: torch.Tensor, num_items_in_batch: int | torch.Tensor | None = None
    ) -> torch.Tensor:
        """Cross-entropy summed over the non-pad target tokens and divided by their number — or by
        `num_items_in_batch`, the Trainer's count over all gradient-accumulation steps (and processes)."""
        if labels.shape != logits.shape[:2]:
            raise ValueError(
                f"labels have shape {tuple(labels.shape)} but the decoder produced {tuple(logits.shape[:2])}"
            )
        labels = labels.to(logits.device)
        ignored = labels.eq(-100) | labels.eq(self.config.pad_token_id)
        if not is_torchdynamo_compiling() and not ignored.all():
            check_token_ids(labels[~ignored].view(1, -1), self.config.vocab_size, "labels (other than -100)")
        total = nn.functional.cross_entropy(
            logits.flatten(0, 1).float(), labels.masked_fill(ignored, -100).flatten(), ignore_index=-100,
            reduction="sum",
        )
        if num_items_in_batch is None:
            num_items_in_batch = (~ignored).sum().clamp(min=1)
        elif torch.is_tensor(num_items_in_batch):
            num_items_in_batch = num_items_in_batch.to(total.device)
        return total / num_items_in_batch

    def prepare_decoder_input_ids_from_labels(self, labels: torch.Tensor) -> torch.Tensor:
        return shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)

    def generate(self, inputs: torch.Tensor | None = None, generation_config=None, **kwargs):
        """transformers' `generate()`; where the generation config asks for the paper's decoding (§6.1, `gnmt_alpha`,
        as `training/run.py` saves it), beam search with the GNMT length penalty, and a one-line refusal of what it
        does not take (`gnmt.paper_decoding`)."""
        return paper_decoding(self, super().generate, inputs, generation_config, **kwargs)


__all__ = ["VaswaniForConditionalGeneration", "VaswaniModel", "VaswaniPreTrainedModel"]
