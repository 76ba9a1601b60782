"""Export to CTranslate2 through its own converter: a loader registered for `VaswaniConfig`.

CTranslate2's `TransformersConverter` finds a loader by the name of the configuration class; this module registers
one for ours, so that `TransformersConverter(folder_or_hub_id).convert(out, quantization=...)` does the rest (loading,
validation, quantization, the vocabulary, writing `model.bin`). What our model computes differently from the
Marian and BART loaders it resembles:

- positions: the §3.5 sinusoids interleave sin and cos (PE(pos, 2i) = sin, PE(pos, 2i+1) = cos), where CTranslate2's
  built-in table puts all sines before all cosines; the table is written out, `POSITIONS` rows of it.
- the decoder starts from the embedding of its start token, as here (Marian's loader forces a zero vector).
- post-LN stacks end without a LayerNorm; pre-LN ones (`normalize_before`) end with one.
- int8 weights keep to 7 bits (-63..63). CTranslate2 multiplies int8 matrices with unsigned 8-bit activations; on
  CPUs without VNNI (AVX2 only) the instruction adds pairs of those products in 16 bits, which saturates with
  8-bit weights (255 · 127 · 2 > 32767). Measured on an AVX2 AMD EPYC, on a briefly trained model's token
  log-probabilities: stock int8 errs by 0.47 on average against float32, 7-bit weights by 0.026, our own int8
  (`quantization.py`, 7-bit activations there for the same reason) by 0.027. The deploying CPU is unknown at
  export time, so the weights take the range that is safe on all of them.

Decoding in CTranslate2 is its own: its beam search divides scores by |Y|^length_penalty, as transformers'
`generate()` does, not by the paper's ((5 + |Y|) / 6)^alpha (`gnmt.py`); its outputs match `generate()`'s.
`vaswani_hf/tools/ctranslate2_engine.py` decodes with such an export for `vaswani-translate --engine ctranslate2`.
"""

import copy

import numpy as np
import torch
from ctranslate2.converters.converter import Converter
from ctranslate2.converters.transformers import BartLoader, register_loader
from ctranslate2.specs import transformer_spec
from ctranslate2.specs.common_spec import Activation
from ctranslate2.specs.model_spec import NumpyVariable, Variable, visit_spec

from ..gnmt import EXTRA_OUTPUT_LENGTH
from ..modeling_vaswani import sinusoidal_position_encoding

# CTranslate2 truncates inputs to 1024 tokens (`max_input_length`); §6.1 lets outputs run 50 longer.
POSITIONS = 1024 + EXTRA_OUTPUT_LENGTH
ACTIVATIONS = {"relu": Activation.RELU, "swish": Activation.SWISH, "gelu": Activation.GELU}


@register_loader("VaswaniConfig")
class VaswaniLoader(BartLoader):
    """Fills CTranslate2's Transformer specification from a `VaswaniForConditionalGeneration`."""

    @property
    def architecture_name(self):
        return "AutoModelForSeq2SeqLM"  # looked up in transformers; the Auto class finds our model

    def get_model_spec(self, model):
        config = model.config
        if config.d_k != config.d_v:
            raise ValueError(f"CTranslate2 has one head width; this model has d_k={config.d_k}, d_v={config.d_v}")
        options = {"pre_norm": config.normalize_before, "activation": ACTIVATIONS[config.activation_function],
                   "head_dim": None if config.d_k * config.num_heads == config.d_model else config.d_k}
        stacks = (
            transformer_spec.TransformerEncoderSpec(config.num_layers, config.num_heads, **options),
            transformer_spec.TransformerDecoderSpec(config.num_decoder_layers, config.num_heads, **options),
        )
        spec = SaturationSafeSpec(*stacks)
        self.set_encoder(spec.encoder, model.model.encoder)
        self.set_decoder(spec.decoder, model.model.decoder)
        self.set_linear(spec.decoder.projection, model.lm_head)
        if config.add_final_logits_bias:  # Marian's output bias (converted models)
            spec.decoder.projection.bias = model.final_logits_bias.squeeze(0)
        return spec

    def set_config(self, config, model, tokenizer):
        super().set_config(config, model, tokenizer)  # bos, eos, unk and the decoder's start token
        # Tokens a converted model's tokenizer does not name (Marian's has no BOS; FSMT's calls </s> its separator):
        # the model's own ids, and the decoder's start token for a missing BOS.
        for name, token_id in (("bos_token", model.config.bos_token_id), ("eos_token", model.config.eos_token_id)):
            if getattr(config, name) is None:
                token = None if token_id is None else tokenizer.convert_ids_to_tokens(token_id)
                setattr(config, name, token or config.decoder_start_token)
        config.layer_norm_epsilon = model.config.layer_norm_eps

    def get_vocabulary(self, model, tokenizer):
        tokens = len(tokenizer.get_vocab())  # BART's loader would drop those past the model's vocabulary
        if tokens != model.config.vocab_size:
            raise ValueError(f"the tokenizer has {tokens} tokens but the model's vocabulary {model.config.vocab_size}")
        return super().get_vocabulary(model, tokenizer)

    def set_common_layers(self, spec, stack):
        """Embedding × sqrt(d_model) + positions, and the final LayerNorm of a pre-LN stack."""
        spec.scale_embeddings = stack.embed_scale
        self.set_embeddings(spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings,
                            stack.embed_tokens)
        if stack.embed_positions is not None:  # learned positions (Table 3, row E)
            spec.position_encodings.encodings = stack.embed_positions.weight
        else:
            config = stack.config
            spec.position_encodings.encodings = sinusoidal_position_encoding(
                torch.arange(POSITIONS) + config.position_offset, config.d_model, config.position_encoding_layout,
                config.position_encoding_frequencies)
        if stack.layer_norm is not None:
            self.set_layer_norm(spec.layer_norm, stack.layer_norm)


class SaturationSafeSpec(transformer_spec.TransformerSpec):
    """CTranslate2's Transformer specification whose int8 weights keep to 7 bits (module docstring)."""

    def optimize(self, quantization: str | None = None) -> None:
        weights = {}  # every quantizable weight, in float32, before CTranslate2 quantizes it to 8 bits

        def remember(spec, name, value):
            if name.endswith("/weight") and hasattr(spec, "weight_scale") and isinstance(value, Variable):
                weights[id(spec)] = (spec, value.to("float32").numpy().copy())  # CTranslate2 quantizes in place

        visit_spec(self, remember)
        super().optimize(quantization)  # shared matrices become one, then quantization
        if not (quantization or "").startswith("int8"):
            return
        for spec, weight in weights.values():
            if isinstance(spec.weight, str):  # an alias of a matrix quantized elsewhere
                continue
            quantized, scale = seven_bits(weight)
            spec.weight, spec.weight_scale = NumpyVariable(quantized), NumpyVariable(scale)


def seven_bits(weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`weight` (float32, one row per output) as int8 in -63..63 and each row's scale (int8 = weight · scale). As in
    CTranslate2's own quantization, a row of zeros gets scale 1 and a tiny row a finite scale."""
    peak = np.abs(weight).max(axis=1)
    peak = np.maximum(np.where(peak == 0, 63.0, peak), 63.0 / np.finfo(np.float32).max)
    scale = (63.0 / peak).astype(np.float32)
    return np.rint(weight * scale[:, None]).astype(np.int8), scale


class VaswaniConverter(Converter):
    """CTranslate2's converter for a model and tokenizer already loaded (`vaswani-export ctranslate2`)."""

    def __init__(self, model, tokenizer):
        self.model, self.tokenizer = model, tokenizer

    def _load(self):
        return VaswaniLoader()(copy.deepcopy(self.model), self.tokenizer)  # a copy: CTranslate2 quantizes in place


def export(model, tokenizer, output_dir: str, quantization: str | None = None) -> str:
    """Write `model` as a CTranslate2 model folder (`model.bin`, the vocabulary) with the tokenizer beside it."""
    VaswaniConverter(model, tokenizer).convert(str(output_dir), quantization=quantization)
    tokenizer.save_pretrained(output_dir)
    return str(output_dir)
