"""Parity with independent implementations: the same weights give the same logits (float32, 1e-5).

References: torch.nn.Transformer (post-LN, its stack-final norms replaced by identity) with the §3.5
sinusoids written out from the formula here, and transformers' MarianMTModel configured as the paper.
"""

import math
import warnings

import pytest
import torch
from support import BOS, EOS, PAD, formula_position_encoding, random_ids, tiny_model
from torch import nn
from transformers import MarianConfig, MarianMTModel

ATOL = 1e-5


def padded_batch():
    """Two sources of different length (the second right-padded) and two targets."""
    source = random_ids(2, 9, seed=1)
    source_mask = torch.ones_like(source)
    source[1, 6:], source_mask[1, 6:] = PAD, 0
    target = torch.cat([torch.full((2, 1), BOS), random_ids(2, 6, seed=2)], dim=1)
    return source, source_mask, target


def copy_attention(reference: nn.MultiheadAttention, ours) -> None:
    reference.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    reference.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.k_proj.bias, ours.v_proj.bias]))
    reference.out_proj.weight.copy_(ours.out_proj.weight)
    reference.out_proj.bias.copy_(ours.out_proj.bias)


def copy_linear(reference: nn.Linear, ours: nn.Linear, rows=slice(None), cols=slice(None)) -> None:
    reference.weight.copy_(ours.weight[rows][:, cols])
    if reference.bias is not None:
        reference.bias.copy_(ours.bias[rows])


def copy_norm(reference: nn.LayerNorm, ours: nn.LayerNorm, index=slice(None)) -> None:
    reference.weight.copy_(ours.weight[index])
    reference.bias.copy_(ours.bias[index])


def torch_transformer(model) -> nn.Transformer:
    """torch.nn.Transformer with our weights: post-LN with its stack-final norms replaced by identity (the paper's
    stacks end without one), or pre-LN with our final norms. Dropout modules as built: P_drop 0."""
    c = model.config
    with warnings.catch_warnings():  # "enable_nested_tensor is True, but ...": a fast path these tests do not take
        warnings.simplefilter("ignore", UserWarning)
        reference = nn.Transformer(
            d_model=c.d_model, nhead=c.num_heads, num_encoder_layers=c.num_layers,
            num_decoder_layers=c.num_decoder_layers, dim_feedforward=c.d_ff, dropout=0.0, activation="relu",
            layer_norm_eps=c.layer_norm_eps, batch_first=True, norm_first=c.normalize_before,
        )
    with torch.no_grad():
        if c.normalize_before:
            copy_norm(reference.encoder.norm, model.model.encoder.layer_norm)
            copy_norm(reference.decoder.norm, model.model.decoder.layer_norm)
        else:
            reference.encoder.norm = nn.Identity()
            reference.decoder.norm = nn.Identity()
        for ref, ours in zip(reference.encoder.layers, model.model.encoder.layers):
            copy_attention(ref.self_attn, ours.self_attn)
            copy_linear(ref.linear1, ours.fc1), copy_linear(ref.linear2, ours.fc2)
            copy_norm(ref.norm1, ours.self_attn_layer_norm), copy_norm(ref.norm2, ours.final_layer_norm)
        for ref, ours in zip(reference.decoder.layers, model.model.decoder.layers):
            copy_attention(ref.self_attn, ours.self_attn)
            copy_attention(ref.multihead_attn, ours.encoder_attn)
            copy_linear(ref.linear1, ours.fc1), copy_linear(ref.linear2, ours.fc2)
            copy_norm(ref.norm1, ours.self_attn_layer_norm)
            copy_norm(ref.norm2, ours.encoder_attn_layer_norm)
            copy_norm(ref.norm3, ours.final_layer_norm)
    return reference


def torch_transformer_logits(reference: nn.Transformer, model, source, source_mask, target, drop=None):
    """The reference's logits: the §3.4 scaled embeddings plus the §3.5 sinusoids of the formula, `drop` applied to
    those sums (§5.4), and the shared embedding as the pre-softmax projection, without bias."""
    c = model.config
    drop = drop or nn.Identity()
    embedding = model.get_input_embeddings().weight.detach().clone()
    scale = math.sqrt(c.d_model)
    source_in = drop(embedding[source] * scale + formula_position_encoding(source.shape[1], c.d_model))
    target_in = drop(embedding[target] * scale + formula_position_encoding(target.shape[1], c.d_model))
    hidden = reference(
        source_in, target_in,
        tgt_mask=nn.Transformer.generate_square_subsequent_mask(target.shape[1]),
        src_key_padding_mask=source_mask == 0,
        memory_key_padding_mask=source_mask == 0,
    )
    return hidden @ embedding.T


@pytest.mark.parametrize(("normalize_before", "layer_norm_eps"), [(False, 1e-6), (True, 1e-6), (False, 0.5)],
                         ids=["post-LN (paper)", "pre-LN (option)", "post-LN, LayerNorm epsilon 0.5"])
@torch.no_grad()
def test_logits_match_torch_nn_transformer(normalize_before, layer_norm_eps):
    """With the LayerNorms' epsilon far from the default too, so that each LayerNorm must take the config's."""
    model = tiny_model(seed=3, num_decoder_layers=2, normalize_before=normalize_before, layer_norm_eps=layer_norm_eps)
    source, source_mask, target = padded_batch()
    expected = torch_transformer_logits(torch_transformer(model).eval(), model, source, source_mask, target)
    for implementation in ("eager", "sdpa"):
        model.set_attn_implementation(implementation)
        logits = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits
        torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


class FixedDropout(nn.Module):
    """Dropout with p = 1/3 whose mask is fixed: (position + feature) % 3 == 0 dropped, the rest scaled by 3/2, so
    that two implementations drop the same units wherever they call it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length, width = x.shape[-2:]
        kept = (torch.arange(length)[:, None] + torch.arange(width)) % 3 != 0
        return x * kept * 1.5


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-LN (paper)", "pre-LN (option)"])
@torch.no_grad()
def test_dropout_falls_where_section_5_4_puts_it(normalize_before):
    """§5.4: "We apply dropout to the output of each sub-layer, before it is added to the sub-layer input and
    normalized. In addition, we apply dropout to the sums of the embeddings and the positional encodings": in
    training, our model and torch.nn.Transformer drop the same units at those places (and only there: attention
    and activation dropouts are 0) and give the same logits."""
    model = tiny_model(seed=3, num_decoder_layers=2, normalize_before=normalize_before, dropout=0.3).train()
    dropouts = [name for name, module in model.named_modules()
                if isinstance(module, nn.Dropout) and module.p == model.config.dropout]
    assert len(dropouts) == 2 + model.config.num_layers + model.config.num_decoder_layers  # one a stack, one a layer
    for name in dropouts:
        model.set_submodule(name, FixedDropout())
    reference = torch_transformer(model).train()  # training: no fused fast path, each dropout module called
    for layer in [*reference.encoder.layers, *reference.decoder.layers]:
        for name in ("dropout1", "dropout2", "dropout3"):
            if hasattr(layer, name):
                setattr(layer, name, FixedDropout())
    source, source_mask, target = padded_batch()
    expected = torch_transformer_logits(reference, model, source, source_mask, target, drop=FixedDropout())
    logits = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)


def marian_feature_order(d_model: int) -> torch.Tensor:
    """Marian's positions are [sin of every frequency, cos of every frequency]; the paper interleaves them.
    Feature j of the Marian model is feature order[j] of ours."""
    return torch.cat([torch.arange(0, d_model, 2), torch.arange(1, d_model, 2)])


@torch.no_grad()
def test_logits_match_marian_mt_model():
    model = tiny_model(seed=4, layer_norm_eps=1e-5)  # Marian's LayerNorms use torch's default epsilon
    c = model.config
    marian = MarianMTModel(
        MarianConfig(
            vocab_size=c.vocab_size, decoder_vocab_size=c.vocab_size, d_model=c.d_model,
            encoder_layers=c.num_layers, decoder_layers=c.num_decoder_layers,
            encoder_attention_heads=c.num_heads, decoder_attention_heads=c.num_heads,
            encoder_ffn_dim=c.d_ff, decoder_ffn_dim=c.d_ff, activation_function="relu", scale_embedding=True,
            share_encoder_decoder_embeddings=True, max_position_embeddings=64, dropout=0.0,
            pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=BOS, forced_eos_token_id=None,
        )
    ).eval()
    # Permute the model dimension so that Marian's half-split sinusoids line up with the paper's interleaved ones;
    # every LayerNorm and residual is permutation-equivariant, and the logits do not depend on the order.
    order = marian_feature_order(c.d_model)
    marian.model.shared.weight.copy_(model.get_input_embeddings().weight[:, order])
    marian.final_logits_bias.zero_()
    stacks = [(marian.model.encoder.layers, model.model.encoder.layers),
              (marian.model.decoder.layers, model.model.decoder.layers)]
    for marian_layers, our_layers in stacks:
        for ref, ours in zip(marian_layers, our_layers):
            attentions = [("self_attn", "self_attn_layer_norm")]
            if hasattr(ours, "encoder_attn"):
                attentions.append(("encoder_attn", "encoder_attn_layer_norm"))
            for attention, norm in attentions:
                for projection in ("q_proj", "k_proj", "v_proj"):
                    copy_linear(getattr(getattr(ref, attention), projection),
                                getattr(getattr(ours, attention), projection), cols=order)
                copy_linear(getattr(ref, attention).out_proj, getattr(ours, attention).out_proj, rows=order)
                copy_norm(getattr(ref, norm), getattr(ours, norm), order)
            copy_linear(ref.fc1, ours.fc1, cols=order)
            copy_linear(ref.fc2, ours.fc2, rows=order)
            copy_norm(ref.final_layer_norm, ours.final_layer_norm, order)

    source, source_mask, target = padded_batch()
    # use_cache=False: Marian sizes its cache by the encoder's layer count, and our decoder has one more layer.
    expected = marian(input_ids=source, attention_mask=source_mask, decoder_input_ids=target, use_cache=False).logits
    logits = model(input_ids=source, attention_mask=source_mask, decoder_input_ids=target).logits
    torch.testing.assert_close(logits, expected, atol=ATOL, rtol=0)
