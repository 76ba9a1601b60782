"""Properties of the architecture (§3) that hold whatever the weights: who sees what, masking, positions,
attention kernels, outputs, initialization and the loss."""

import math

import pytest
import torch
from support import BOS, EOS, PAD, formula_position_encoding, random_ids, tiny_model
from torch import nn

from vaswani_hf.modeling_vaswani import shift_tokens_right, sinusoidal_position_encoding


def decoder_inputs(batch: int, length: int, seed: int = 7) -> torch.Tensor:
    return torch.cat([torch.full((batch, 1), BOS), random_ids(batch, length - 1, seed=seed)], dim=1)


def test_sinusoids_follow_the_formula_and_have_no_length_limit():
    positions = torch.arange(0, 40)
    torch.testing.assert_close(sinusoidal_position_encoding(positions, 24), formula_position_encoding(40, 24))
    far = sinusoidal_position_encoding(torch.tensor([5001]), 16)[0]  # past float16's and bfloat16's whole numbers
    expected = torch.tensor([(math.sin, math.cos)[j % 2](5001 / 10000 ** (2 * (j // 2) / 16)) for j in range(16)])
    torch.testing.assert_close(far, expected, atol=1e-4, rtol=0)


def test_positions_are_computed_not_stored_and_work_past_max_position_embeddings(model):
    assert not any("position" in name for name in model.state_dict())
    assert not list(model.buffers())
    source = random_ids(1, model.config.max_position_embeddings + 10)
    logits = model(input_ids=source, decoder_input_ids=decoder_inputs(1, 3)).logits
    assert torch.isfinite(logits).all()


def test_the_converted_models_tables_are_marians_and_fairseqs():
    """position_encoding_layout="halves" with the paper's frequencies is Marian's table (transformers'
    MarianSinusoidalPositionalEmbedding); with position_encoding_frequencies="fairseq", from position 2 (its padding
    index + 1), it is fairseq's (FSMT's SinusoidalPositionalEmbedding on a sequence without padding). The paper's
    interleaved table is neither."""
    from transformers.models.fsmt.modeling_fsmt import SinusoidalPositionalEmbedding
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding

    marian = MarianSinusoidalPositionalEmbedding(64, 24).create_weight()  # float64 angles, then float32
    torch.testing.assert_close(sinusoidal_position_encoding(torch.arange(64), 24, "halves"), marian, atol=1e-5, rtol=0)
    fsmt = SinusoidalPositionalEmbedding(64, 24, padding_idx=1)
    fsmt.make_weight(64, 24, 1)
    fairseq = fsmt(torch.full((1, 50), 7))[0]
    torch.testing.assert_close(sinusoidal_position_encoding(torch.arange(50) + 2, 24, "halves", "fairseq"), fairseq,
                               atol=1e-6, rtol=0)
    assert not torch.allclose(sinusoidal_position_encoding(torch.arange(64), 24), marian, atol=0.1)
    assert not torch.allclose(sinusoidal_position_encoding(torch.arange(50) + 2, 24, "halves"), fairseq, atol=0.1)


def test_a_model_adds_the_table_its_config_names_and_decodes_the_same_with_its_cache():
    """fairseq's table, from position_offset on, is what the first encoder layer sees added to the scaled
    embeddings; decoding with and without the cache (positions counted from the cache's length) agrees."""
    model = tiny_model(position_encoding_layout="halves", position_encoding_frequencies="fairseq", position_offset=2)
    seen = []
    model.model.encoder.layers[0].register_forward_pre_hook(lambda layer, args: seen.append(args[0]))
    source = random_ids(2, 7)
    model.model.encoder(input_ids=source)
    table = sinusoidal_position_encoding(torch.arange(7) + 2, 24, "halves", "fairseq")
    torch.testing.assert_close(seen[0], model.model.encoder.embed_tokens(source) * 24**0.5 + table)
    decoding = {"max_new_tokens": 6, "num_beams": 1, "do_sample": False}
    with torch.no_grad():
        cached = model.generate(source, use_cache=True, **decoding)
        uncached = model.generate(source, use_cache=False, **decoding)
    assert torch.equal(cached, uncached)


@pytest.mark.parametrize(("scale", "factor"), [(True, 24**0.5), (False, 1.0)])
def test_the_embeddings_are_scaled_by_sqrt_d_model_unless_the_config_says_not(scale, factor):
    """§3.4: "In the embedding layers, we multiply those weights by sqrt(d_model)"; `scale_embedding=False` (a
    deviation) adds the positions to the rows as they are."""
    model, seen, source = tiny_model(scale_embedding=scale), [], random_ids(2, 7)
    model.model.encoder.layers[0].register_forward_pre_hook(lambda layer, args: seen.append(args[0]))
    model.model.encoder(input_ids=source)
    expected = model.model.encoder.embed_tokens(source) * factor + formula_position_encoding(7, 24)
    torch.testing.assert_close(seen[0], expected)


def test_learned_positions_are_weights_with_a_limit():
    model = tiny_model(position_embedding="learned", max_position_embeddings=12)
    assert model.model.encoder.embed_positions.weight.shape == (12, 24)
    assert "model.decoder.embed_positions.weight" in model.state_dict()
    model(input_ids=random_ids(1, 12), decoder_input_ids=decoder_inputs(1, 12))
    with pytest.raises(ValueError, match="max_position_embeddings=12"):
        model(input_ids=random_ids(1, 13), decoder_input_ids=decoder_inputs(1, 2))
    # Decoding with a cache: the 13th position is refused though the step feeds one token.
    cache = model(input_ids=random_ids(1, 4), decoder_input_ids=decoder_inputs(1, 12)).cache
    with pytest.raises(ValueError, match="Sequence of 13 positions is longer than the max_position_embeddings=12"):
        model(input_ids=random_ids(1, 4), decoder_input_ids=torch.tensor([[5]]), cache=cache)


@torch.no_grad()
def test_the_encoder_sees_the_whole_source(model):
    source = random_ids(1, 8)
    changed = source.clone()
    changed[0, -1] = 4 if source[0, -1] != 4 else 5
    first = model.get_encoder()(input_ids=source).last_hidden_state[0, 0]
    assert not torch.allclose(first, model.get_encoder()(input_ids=changed).last_hidden_state[0, 0])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@torch.no_grad()
def test_the_decoder_never_sees_the_future(model, implementation):
    model.set_attn_implementation(implementation)
    source, target = random_ids(2, 6), decoder_inputs(2, 7)
    logits = model(input_ids=source, decoder_input_ids=target).logits
    for t in range(1, 7):
        changed = target.clone()
        changed[:, t] = torch.where(target[:, t] == 4, 5, 4)
        changed_logits = model(input_ids=source, decoder_input_ids=changed).logits
        torch.testing.assert_close(changed_logits[:, :t], logits[:, :t], atol=1e-6, rtol=0)
        assert not torch.allclose(changed_logits[:, t:], logits[:, t:])


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
@torch.no_grad()
def test_masked_source_padding_changes_nothing(model, implementation):
    model.set_attn_implementation(implementation)
    source, target = random_ids(1, 5), decoder_inputs(1, 4)
    alone = model(input_ids=source, decoder_input_ids=target).logits
    padded = torch.cat([source, random_ids(1, 4, seed=9)], dim=1)  # real tokens, hidden only by the mask
    mask = torch.tensor([[1] * 5 + [0] * 4])
    torch.testing.assert_close(model(input_ids=padded, attention_mask=mask, decoder_input_ids=target).logits, alone,
                               atol=1e-5, rtol=0)


@torch.no_grad()
def test_a_4d_mask_is_taken_as_built(model):
    """transformers' custom masks: a (batch, 1, query, key) boolean mask reaches the attention as given (the 2D
    mask's shape check does not refuse it) and masks as the 2D one it was made from."""
    source, mask = random_ids(2, 5), torch.ones(2, 5, dtype=torch.long)
    mask[1, 3:] = 0
    built = mask[:, None, None, :].bool().expand(2, 1, 5, 5)
    torch.testing.assert_close(model.get_encoder()(input_ids=source, attention_mask=built).last_hidden_state,
                               model.get_encoder()(input_ids=source, attention_mask=mask).last_hidden_state)


@torch.no_grad()
def test_eager_and_sdpa_give_the_same_outputs(model):
    """With and without masks: without one, SDPA must not fall back to a causal encoder or cross attention."""
    source, target = random_ids(3, 7), decoder_inputs(3, 5)
    mask = torch.ones_like(source)
    mask[1, 4:] = 0
    for kwargs in ({}, {"attention_mask": mask}):
        outputs = {}
        for implementation in ("eager", "sdpa"):
            model.set_attn_implementation(implementation)
            outputs[implementation] = model(input_ids=source, decoder_input_ids=target, **kwargs)
        for key in ("logits", "encoder_last_hidden_state"):
            torch.testing.assert_close(outputs["sdpa"][key], outputs["eager"][key], atol=1e-5, rtol=0)


def test_eager_attention_takes_a_boolean_mask_as_sdpa_does_and_an_additive_one_alike():
    """eager_attention_forward receives transformers' additive masks (the eager kernel's) or boolean ones (SDPA's,
    True: attend): with either, torch's scaled_dot_product_attention on the boolean mask is the reference."""
    from vaswani_hf.modeling_vaswani import eager_attention_forward

    generator = torch.Generator().manual_seed(3)
    query, key, value = (torch.randn(2, 3, length, 8, generator=generator) for length in (5, 6, 6))
    allowed = torch.rand(2, 1, 5, 6, generator=generator) > 0.4
    allowed[..., 0] = True  # every query sees a key
    expected = nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed).transpose(1, 2)
    additive = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    for mask in (allowed, additive):
        output, weights = eager_attention_forward(nn.Module(), query, key, value, mask, scaling=8**-0.5)
        torch.testing.assert_close(output, expected)
        assert torch.all(weights[~allowed.expand_as(weights)] == 0)


@torch.no_grad()
def test_attention_and_hidden_state_outputs(model):
    model.set_attn_implementation("eager")
    c = model.config
    source, target = random_ids(2, 7), decoder_inputs(2, 5)
    out = model(input_ids=source, decoder_input_ids=target, output_attentions=True, output_hidden_states=True)
    assert len(out.encoder_attentions) == c.num_layers and len(out.encoder_hidden_states) == c.num_layers + 1
    assert len(out.decoder_attentions) == len(out.cross_attentions) == c.num_decoder_layers
    assert len(out.decoder_hidden_states) == c.num_decoder_layers + 1
    for weights, shape in ((out.encoder_attentions, (2, 3, 7, 7)), (out.decoder_attentions, (2, 3, 5, 5)),
                           (out.cross_attentions, (2, 3, 5, 7))):
        for layer in weights:
            assert layer.shape == shape
            torch.testing.assert_close(layer.sum(-1), torch.ones(shape[:-1]))
    for layer in out.decoder_attentions:
        assert (layer.triu(diagonal=1) == 0).all()
    torch.testing.assert_close(out.encoder_hidden_states[-1], out.encoder_last_hidden_state)


@torch.no_grad()
def test_hidden_states_selected_by_index_count_from_each_stacks_own_end(model):
    """transformers 5's `output_hidden_states=[indices]` keeps those states alone; a negative index counts from the
    end of its own stack (the decoder has `num_decoder_layers`: 3 here, the encoder 2), not from the encoder's."""
    source, target = random_ids(2, 7), decoder_inputs(2, 5)
    full = model(input_ids=source, decoder_input_ids=target, output_hidden_states=True)
    part = model(input_ids=source, decoder_input_ids=target, output_hidden_states=[1, -1])
    for kept, every in ((part.encoder_hidden_states, full.encoder_hidden_states),
                        (part.decoder_hidden_states, full.decoder_hidden_states)):
        assert len(kept) == len(every)
        assert [i for i, state in enumerate(kept) if state is not None] == [1, len(every) - 1]
        torch.testing.assert_close(kept[-1], every[-1])
        torch.testing.assert_close(kept[1], every[1])


def glorot_bound(linear: nn.Linear) -> float:
    return math.sqrt(6 / (linear.in_features + linear.out_features))


def test_initialization_is_the_authors():
    model = tiny_model(authors_init=True, vocab_size=2000, d_model=64, num_heads=4, d_ff=256)
    std = 64**-0.5
    embedding = model.get_input_embeddings().weight
    assert (embedding[PAD] == 0).all()
    assert abs(embedding[1:].std().item() - std) < 0.05 * std and abs(embedding[1:].mean().item()) < 0.01
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module is not model.lm_head:
            bound = glorot_bound(module)
            assert module.weight.abs().max() <= bound, name
            assert abs(module.weight.std().item() - bound / math.sqrt(3)) < 0.1 * bound / math.sqrt(3), name
            assert (module.bias == 0).all(), name
        elif isinstance(module, nn.LayerNorm):
            assert (module.weight == 1).all() and (module.bias == 0).all(), name


def test_shared_embeddings_are_one_matrix_or_three():
    tied = tiny_model()
    assert tied.lm_head.weight is tied.model.encoder.embed_tokens.weight
    assert tied.model.decoder.embed_tokens.weight is tied.model.encoder.embed_tokens.weight
    assert tied.lm_head.bias is None
    untied = tiny_model(tie_word_embeddings=False)
    matrices = [untied.lm_head.weight, untied.model.encoder.embed_tokens.weight,
                untied.model.decoder.embed_tokens.weight]
    assert len({id(m) for m in matrices}) == 3
    std = 24**-0.5
    assert abs(untied.lm_head.weight.std().item() - std) < 0.15 * std


def test_new_input_embeddings_are_both_embeddings_and_the_projection_when_tied_and_the_sources_alone_when_not():
    """§3.4's one matrix stays one when a user swaps it in: `set_input_embeddings` gives it to both stacks at once, as
    Marian's does, and transformers' `tie_weights` to the projection; untied, the new matrix is the encoder's only."""
    for tie in (True, False):
        model = tiny_model(tie_word_embeddings=tie)
        target, projection = model.model.decoder.embed_tokens.weight, model.lm_head.weight
        new = torch.nn.Embedding(53, 24, padding_idx=PAD)
        model.set_input_embeddings(new)
        assert model.model.encoder.embed_tokens is new
        assert model.model.decoder.embed_tokens.weight is (new.weight if tie else target)
        model.tie_weights()
        assert model.lm_head.weight is (new.weight if tie else projection)


def test_resizing_the_vocabulary_keeps_the_matrices_tied_or_resizes_all_three():
    for tie in (True, False):
        model = tiny_model(tie_word_embeddings=tie)
        model.resize_token_embeddings(60)
        assert model.config.vocab_size == 60
        for matrix in (model.lm_head.weight, model.model.encoder.embed_tokens.weight,
                       model.model.decoder.embed_tokens.weight):
            assert matrix.shape == (60, 24)
        assert (model.lm_head.weight is model.model.encoder.embed_tokens.weight) == tie
        logits = model(input_ids=torch.tensor([[59, 5]]), decoder_input_ids=torch.tensor([[BOS, 59]])).logits
        assert logits.shape == (1, 2, 60)


def test_labels_give_the_mean_cross_entropy_over_non_pad_tokens(model):
    source = random_ids(2, 6)
    labels = random_ids(2, 5, seed=3)
    labels[0, 3:] = -100
    labels[1, 4] = PAD
    out = model(input_ids=source, labels=labels)
    # the decoder inputs are the labels shifted right behind the start token
    expected_inputs = torch.cat([torch.full((2, 1), BOS), labels[:, :-1].masked_fill(labels[:, :-1] == -100, PAD)], 1)
    torch.testing.assert_close(out.logits, model(input_ids=source, decoder_input_ids=expected_inputs).logits)
    # by hand: -log p(label) at each kept position, aligned (no second shift), averaged
    log_probs = out.logits.log_softmax(-1)
    kept = [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (1, 2), (1, 3)]
    by_hand = -torch.stack([log_probs[b, t, labels[b, t]] for b, t in kept]).mean()
    torch.testing.assert_close(out.loss, by_hand)
    # the Trainer's num_items_in_batch: sum / count over all accumulated batches
    torch.testing.assert_close(model(input_ids=source, labels=labels, num_items_in_batch=14).loss, by_hand * 7 / 14)
    loss = model(input_ids=source, labels=labels, num_items_in_batch=torch.tensor(7)).loss
    torch.testing.assert_close(loss, by_hand)


def test_a_batch_whose_labels_are_all_padding_has_loss_0():
    """As the Trainer can meet at the end of a dataset cut into batches: no token to learn from, no NaN."""
    model = tiny_model().train()
    loss = model(input_ids=random_ids(2, 6), labels=torch.tensor([[PAD, -100, -100], [-100, PAD, PAD]])).loss
    assert loss.item() == 0.0
    loss.backward()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)


def test_the_loss_of_bfloat16_logits_is_float32s():
    """Under bf16 autocast (training/run.py on a GPU) the cross-entropy is summed over the logits taken to float32,
    not in bfloat16, whose 8 significant bits lose a sum over thousands of tokens."""
    model, source, labels = tiny_model().to(torch.bfloat16), random_ids(4, 6), random_ids(4, 30, seed=3)
    out = model(input_ids=source, labels=labels)
    expected = nn.functional.cross_entropy(out.logits.float().flatten(0, 1), labels.flatten())
    assert out.loss.dtype == torch.float32
    torch.testing.assert_close(out.loss, expected, atol=1e-6, rtol=0)


def test_labels_train_on_decoder_inputs_embeds_and_return_no_cache(model):
    """With labels the forward is a training step, as Marian's: the loss, no decoding cache; and decoder inputs given
    as embeddings are used as they are, not replaced by the shifted labels."""
    source, labels = random_ids(2, 6), random_ids(2, 4, seed=3)
    by_ids = model(input_ids=source, labels=labels)
    assert by_ids.cache is None
    embeds = model.model.decoder.embed_tokens(model.prepare_decoder_input_ids_from_labels(labels))
    by_embeds = model(input_ids=source, decoder_inputs_embeds=embeds, labels=labels)
    torch.testing.assert_close(by_embeds.loss, by_ids.loss)


@torch.no_grad()
def test_encoder_outputs_given_as_a_tuple_are_returned_whole(model):
    """`encoder_outputs` as transformers passes them with return_dict=False: (last_hidden_state, hidden_states,
    attentions); the output carries all three, as when the model encodes."""
    source, target = random_ids(2, 6), decoder_inputs(2, 4)
    encoded = model.get_encoder()(input_ids=source, output_hidden_states=True, output_attentions=True)
    out = model(encoder_outputs=tuple(encoded.values()), decoder_input_ids=target)
    assert out.encoder_hidden_states is encoded.hidden_states and out.encoder_attentions is encoded.attentions
    torch.testing.assert_close(out.logits, model(input_ids=source, decoder_input_ids=target).logits)


@torch.no_grad()
def test_the_decoder_alone_decodes_with_a_plain_cache_as_without(model):
    """A decoder stack called with a `DynamicCache` (not an encoder-decoder one): its self-attention caches the
    steps, and each step's output is the whole sequence's at that position."""
    from transformers import DynamicCache

    decoder, target = model.model.decoder, decoder_inputs(2, 5)
    memory = model.get_encoder()(input_ids=random_ids(2, 6)).last_hidden_state
    whole = decoder(input_ids=target, encoder_hidden_states=memory, use_cache=False).last_hidden_state
    cache = DynamicCache(config=model.config.get_text_config(decoder=True))
    for step in range(5):
        out = decoder(input_ids=target[:, step : step + 1], encoder_hidden_states=memory, cache=cache, use_cache=True)
        torch.testing.assert_close(out.last_hidden_state[:, 0], whole[:, step], atol=1e-5, rtol=0)
    assert cache.get_seq_length() == 5


def test_shift_tokens_right():
    labels = torch.tensor([[5, 6, EOS], [7, EOS, -100]])
    assert shift_tokens_right(labels, PAD, BOS).tolist() == [[BOS, 5, 6], [BOS, 7, EOS]]


def test_gradient_checkpointing_gives_the_same_gradients():
    source, labels = random_ids(2, 6), random_ids(2, 5, seed=4)
    gradients = []
    for checkpointing in (False, True):
        model = tiny_model().train()
        if checkpointing:
            model.activation_checkpointing_enable()
        model(input_ids=source, labels=labels).loss.backward()
        gradients.append({n: p.grad for n, p in model.named_parameters()})
    assert gradients[0].keys() == gradients[1].keys()
    for name in gradients[0]:
        torch.testing.assert_close(gradients[1][name], gradients[0][name], msg=name)


def test_dropout_is_active_in_training_only():
    model = tiny_model(dropout=0.3)
    source, target = random_ids(2, 6), decoder_inputs(2, 4)
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(input_ids=source, decoder_input_ids=target).logits,
                           model(input_ids=source, decoder_input_ids=target).logits)
    model.train()
    assert not torch.equal(model(input_ids=source, decoder_input_ids=target).logits,
                           model(input_ids=source, decoder_input_ids=target).logits)


@torch.no_grad()
def test_a_dropout_set_after_building_drops_as_one_built_with_it():
    """training/run.py fits P_drop to the run between steps (`set_dropout`): every dropout of §5.4 (embeddings,
    sub-layers) must then draw as in a model built with that P_drop, and none at 0; config.json's value follows, and
    the attention and activation dropouts are not P_drop."""
    from training.budget import set_dropout

    source, target = random_ids(2, 6), decoder_inputs(2, 4)
    built = tiny_model(seed=1, dropout=0.3).train()
    changed = tiny_model(seed=1, dropout=0.0).train()
    set_dropout(changed, 0.3)
    assert changed.config.dropout == 0.3 and changed.config.activation_dropout == 0.0
    assert {m.p for name, m in changed.named_modules() if name.endswith("activation_dropout")} == {0.0}

    def logits(model):  # the same dropout draws for both
        torch.manual_seed(5)
        return model(input_ids=source, decoder_input_ids=target).logits

    assert torch.equal(logits(built), logits(changed))
    set_dropout(changed, 0.0)
    assert torch.equal(changed(input_ids=source, decoder_input_ids=target).logits,
                       changed.eval()(input_ids=source, decoder_input_ids=target).logits)


@torch.no_grad()
def test_the_forward_compiles_as_one_graph(model):
    """`_can_compile_fullgraph = True`: torch.compile(fullgraph=True) traces the whole forward, checks included, and
    AOTAutograd's graph computes the forward's logits. (aot_eager: inductor's C++ code for a CPU took 40 s to write
    on a Zen 3 with a cold cache; inductor compiles the model on a GPU in benchmarks/gpu_check.py, the loss on a CPU
    in test_recipe.py.)"""
    source, target = random_ids(2, 6), decoder_inputs(2, 4)
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    torch.testing.assert_close(compiled(input_ids=source, decoder_input_ids=target, use_cache=False).logits,
                               model(input_ids=source, decoder_input_ids=target, use_cache=False).logits,
                               atol=1e-5, rtol=0)


def test_resizing_the_vocabulary_keeps_marians_output_bias_and_gives_new_tokens_none():
    """`add_final_logits_bias`: the bias follows the vocabulary as MarianMTModel's does (rows kept, new ones 0)."""
    model = tiny_model(add_final_logits_bias=True)
    with torch.no_grad():
        model.final_logits_bias.normal_()
    bias = model.final_logits_bias.clone()
    model.resize_token_embeddings(56, mean_resizing=False)
    assert model.final_logits_bias.shape == (1, 56)
    assert torch.equal(model.final_logits_bias[:, :53], bias) and not model.final_logits_bias[:, 53:].any()
    model.resize_token_embeddings(50)
    assert torch.equal(model.final_logits_bias, bias[:, :50])
    assert model(input_ids=random_ids(1, 4, 50), decoder_input_ids=random_ids(1, 3, 50)).logits.shape[-1] == 50


def test_a_forward_returns_its_decoding_cache_by_default_and_not_when_the_config_says_no():
    """As Marian's: `config.use_cache` decides whether a forward without labels returns the cache."""
    from transformers import EncoderDecoderCache

    model = tiny_model().eval()
    inputs = {"input_ids": random_ids(2, 5), "decoder_input_ids": decoder_inputs(2, 4)}
    assert isinstance(model(**inputs).cache, EncoderDecoderCache)
    model.config.use_cache = False
    assert model(**inputs).cache is None
