"""Export to transformers' MarianMTModel: the same network in Marian's layout, for the tools that run Marian models
and not ours (optimum's ONNX exporter, transformers.js, ...). Both follow BART's parameter names; what differs:

- positions: Marian's sinusoids put all sines before all cosines, the paper's (§3.5) interleave them. Permuting the
  d_model coordinates of every weight the same way (sines' coordinates first) computes the same function under
  Marian's table: LayerNorm and the residual sums act coordinate by coordinate, and each product reads its input and
  writes its output in the permuted order. A model already in halves (a converted Marian model) is copied as it is.
- LayerNorm epsilon: Marian's is torch's 1e-5, fixed; the paper's model here uses tensor2tensor's 1e-6. Outputs
  then differ by about 1e-5 of a logit.
- decoding: transformers' beam search ranks by log P / |Y|^α (`length_penalty`), not the paper's ((5 + |Y|) / 6)^α
  (`gnmt.py`), and outputs run to `max_position_embeddings` tokens, not source length + 50.

What Marian does not compute is refused: learned positions, fairseq's frequencies or offset, pre-LN layers, a head
width other than d_model / heads.
"""

from pathlib import Path

import torch
from transformers import GenerationConfig, MarianConfig, MarianMTModel

from ..tools.loading import PAPERS_ALPHA, PAPERS_BEAMS, papers_decoding

# The parameters that read d_model coordinates (their columns) and those that write them (their rows).
READERS = ("embed_tokens.weight", "lm_head.weight", "q_proj.weight", "k_proj.weight", "v_proj.weight", "fc1.weight")
WRITERS = ("out_proj.weight", "out_proj.bias", "fc2.weight", "fc2.bias", "layer_norm.weight", "layer_norm.bias")


def config_of(config) -> MarianConfig:
    """The MarianConfig of a VaswaniConfig, or a ValueError naming what Marian does not compute."""
    refused = [f"{name}={getattr(config, name)!r}" for name, marian in
               (("position_embedding", "sinusoidal"), ("position_encoding_frequencies", "paper"),
                ("position_offset", 0), ("normalize_before", False)) if getattr(config, name) != marian]
    if not config.d_k == config.d_v == config.d_model // config.num_heads:
        refused.append(f"d_k={config.d_k}, d_v={config.d_v} (Marian's heads are d_model / num_heads wide)")
    if refused:
        raise ValueError(f"MarianMTModel does not compute this model's {', '.join(refused)}")
    tied = config.tie_word_embeddings
    return MarianConfig(
        vocab_size=config.vocab_size, decoder_vocab_size=config.vocab_size, d_model=config.d_model,
        encoder_layers=config.num_layers, decoder_layers=config.num_decoder_layers,
        encoder_attention_heads=config.num_heads, decoder_attention_heads=config.num_heads,
        encoder_ffn_dim=config.d_ff, decoder_ffn_dim=config.d_ff, activation_function=config.activation_function,
        dropout=config.dropout, attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout, max_position_embeddings=config.max_position_embeddings,
        scale_embedding=config.scale_embedding, share_encoder_decoder_embeddings=tied, tie_word_embeddings=tied,
        pad_token_id=config.pad_token_id, bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id, forced_eos_token_id=None)


def weights_of(model) -> dict[str, torch.Tensor]:
    """`model`'s weights under Marian's names, their d_model coordinates in Marian's order."""
    d_model = model.config.d_model
    order = (torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])
             if model.config.position_encoding_layout == "interleaved" else torch.arange(d_model))
    weights = {}
    for name, tensor in model.state_dict().items():
        if name.endswith(READERS):
            tensor = tensor[:, order]
        elif name.endswith(WRITERS):
            tensor = tensor[order]
        weights[name] = tensor.float()
    if model.config.tie_word_embeddings:
        weights["model.shared.weight"] = weights["model.encoder.embed_tokens.weight"]
    weights.setdefault("final_logits_bias", torch.zeros(1, model.config.vocab_size))
    return weights


def decoding_of(model) -> GenerationConfig:
    """The model's decoding as transformers' generate() runs it: the paper's beam size with its α as `length_penalty`
    (a converted model's own generation config as it is), up to `max_position_embeddings` tokens."""
    generation = model.generation_config
    config = model.config
    if not papers_decoding(generation):
        return GenerationConfig(**{key: value for key, value in generation.to_diff_dict().items()
                                   if key not in ("gnmt_alpha", "extra_length")})
    beams, alpha = generation.num_beams or PAPERS_BEAMS, getattr(generation, "gnmt_alpha", None)
    search = {"num_beams": beams, "length_penalty": PAPERS_ALPHA if alpha is None else alpha,
              "early_stopping": True} if beams > 1 else {}
    return GenerationConfig(**search, max_length=config.max_position_embeddings, pad_token_id=config.pad_token_id,
                            bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id,
                            decoder_start_token_id=config.decoder_start_token_id)


def export(model, tokenizer, output_dir) -> str:
    """Write the MarianMTModel (safetensors, config, generation config) and the tokenizer to `output_dir`."""
    output_dir = Path(output_dir)
    marian = MarianMTModel(config_of(model.config))
    missing, unexpected = marian.load_state_dict(weights_of(model), strict=False)
    assert not unexpected and all(".embed_positions." in name for name in missing), (missing, unexpected)
    marian.generation_config = decoding_of(model)
    marian.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return str(output_dir)
