"""VaswaniConfig: the paper's symbols and defaults, Table 3, presets, clear errors, Auto registration."""

import json

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

import vaswani_hf
from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel
from vaswani_hf.configuration_vaswani import PAPER_ARCHITECTURE


def count_parameters(config: VaswaniConfig) -> int:
    with torch.device("meta"):
        model = VaswaniForConditionalGeneration(config)
    return sum(p.numel() for p in model.parameters())  # tied matrices are counted once


def test_defaults_are_the_papers_base_model():
    c = VaswaniConfig()
    assert (c.num_layers, c.num_decoder_layers, c.d_model, c.d_ff, c.num_heads, c.d_k, c.d_v) == (
        6, 6, 512, 2048, 8, 64, 64)
    assert (c.dropout, c.attention_dropout, c.activation_dropout, c.layer_norm_eps) == (0.1, 0.0, 0.0, 1e-6)
    assert c.position_embedding == "sinusoidal" and c.scale_embedding and c.tie_word_embeddings
    assert not c.normalize_before and c.is_encoder_decoder
    assert (c.hidden_size, c.num_attention_heads, c.num_hidden_layers) == (512, 8, 6)  # attribute_map


def test_generic_names_set_the_paper_symbols_before_defaults_are_derived():
    c = VaswaniConfig(hidden_size=32, num_attention_heads=4, num_hidden_layers=3)
    assert (c.d_model, c.num_heads, c.d_k, c.d_v, c.num_layers, c.num_decoder_layers) == (32, 4, 8, 8, 3, 3)


def test_big_preset_and_overrides():
    big = VaswaniConfig.big()
    assert (big.d_model, big.d_ff, big.num_heads, big.d_k, big.dropout) == (1024, 4096, 16, 64, 0.3)
    assert VaswaniConfig.big(dropout=0.1).dropout == 0.1  # EN-FR big used P_drop = 0.1 (§6.1)
    assert VaswaniConfig.base(vocab_size=100).to_dict() == VaswaniConfig(vocab_size=100).to_dict()


# Table 3 with the authors' 40,960-entry vocabulary: parameters rounded to millions.
TABLE_3 = {
    "base": ({}, 65),
    "B d_k=16": ({"d_k": 16}, 58),
    "B d_k=32": ({"d_k": 32}, 60),
    "C N=2": ({"num_layers": 2}, 36),
    "C N=4": ({"num_layers": 4}, 50),
    "C N=8": ({"num_layers": 8}, 80),
    "C d_model=256": ({"d_model": 256}, 28),
    "C d_model=1024": ({"d_model": 1024}, 168),
    "C d_ff=1024": ({"d_ff": 1024}, 53),
    "C d_ff=4096": ({"d_ff": 4096}, 90),
}


@pytest.mark.parametrize("row", TABLE_3)
def test_table_3_parameter_counts(row):
    overrides, millions = TABLE_3[row]
    assert round(count_parameters(VaswaniConfig(vocab_size=40960, **overrides)) / 1e6) == millions


@pytest.mark.parametrize(
    "overrides", [{"num_heads": 1, "d_k": 512, "d_v": 512}, {"num_heads": 4}, {"num_heads": 16}, {"num_heads": 32}]
)
def test_table_3_row_a_keeps_the_parameter_count(overrides):
    """Row (A) varies h with d_k = d_v = d_model / h: the parameter count does not move."""
    assert round(count_parameters(VaswaniConfig(vocab_size=40960, **overrides)) / 1e6) == 65


def test_table_3_rows_d_and_e_are_expressible():
    assert VaswaniConfig(dropout=0.0).dropout == 0.0 and VaswaniConfig(dropout=0.2).dropout == 0.2
    learned = VaswaniConfig(vocab_size=40960, position_embedding="learned", max_position_embeddings=256)
    assert count_parameters(learned) == count_parameters(VaswaniConfig(vocab_size=40960)) + 2 * 256 * 512


def test_base_with_37000_vocabulary_has_63_1_million_parameters():
    assert round(count_parameters(VaswaniConfig(vocab_size=37000)) / 1e5) == 631


@pytest.mark.parametrize(
    "kwargs, name",
    [
        ({"num_heads": 7}, "num_heads"),
        ({"dropout": 1.0}, "dropout"),
        ({"dropout": -0.1}, "dropout"),
        ({"attention_dropout": 1.5}, "attention_dropout"),
        ({"activation_dropout": -1}, "activation_dropout"),
        ({"position_embedding": "rotary"}, "position_embedding"),
        ({"num_layers": 0}, "num_layers"),
        ({"num_decoder_layers": 0}, "num_decoder_layers"),
        ({"d_model": 0}, "d_model"),
        ({"d_ff": -3}, "d_ff"),
        ({"d_k": 0}, "d_k"),
        ({"vocab_size": 0}, "vocab_size"),
        ({"num_layers": True}, "num_layers"),
        ({"d_ff": 2048.0}, "d_ff"),
        ({"vocab_size": 10, "bos_token_id": 10}, "bos_token_id"),
        ({"vocab_size": 10, "decoder_start_token_id": 10}, "decoder_start_token_id"),
        ({"vocab_size": 10, "eos_token_id": 10}, "eos_token_id=10 is outside the vocabulary"),
        ({"vocab_size": 10, "eos_token_id": [2, 10]}, "eos_token_id=[2, 10] is outside the vocabulary"),
        ({"pad_token_id": None}, "pad_token_id is None"),
        ({"decoder_start_token_id": None}, "decoder_start_token_id is None"),
        ({"d_model": 15, "num_heads": 3}, "even d_model"),
        ({"layer_norm_eps": 0.0}, "layer_norm_eps"),
        ({"max_position_embeddings": 0}, "max_position_embeddings"),
        ({"position_encoding_layout": "split"}, "position_encoding_layout"),
        ({"position_encoding_frequencies": "t2t"}, "position_encoding_frequencies"),
        ({"position_offset": -1}, "position_offset"),
        ({"position_offset": 1.5}, "position_offset"),
        ({"activation_function": "tanh"}, "activation_function"),
        ({"d_model": 2, "num_heads": 1, "position_encoding_frequencies": "fairseq"}, "d_model"),
    ],
)
def test_impossible_config_raises_value_error_naming_the_argument(kwargs, name):
    with pytest.raises(ValueError) as error:
        VaswaniConfig(**kwargs)
    message = str(error.value)
    assert name in message and "\n" not in message


def test_explicit_d_k_d_v_allow_any_head_count():
    c = VaswaniConfig(d_model=512, num_heads=7, d_k=64, d_v=32)
    assert (c.d_k, c.d_v) == (64, 32)


def test_an_odd_d_model_is_refused_by_the_sinusoids_alone():
    assert VaswaniConfig(d_model=15, num_heads=3, position_embedding="learned").d_k == 5


def test_the_decoders_view_has_the_decoders_depth_and_leaves_the_config_as_it_was():
    """transformers sizes the decoding cache from `get_text_config(decoder=True)`."""
    config = VaswaniConfig(num_layers=2, num_decoder_layers=3)
    assert config.get_text_config(decoder=True).num_layers == 3
    assert config.get_text_config(encoder=True).num_layers == 2 == config.num_layers
    assert config.get_text_config() is config.get_text_config(decoder=True, encoder=True) is config
    assert config.num_layers == 2


def test_each_config_holds_its_own_pipeline_entry():
    from vaswani_hf.pipeline_vaswani import CUSTOM_PIPELINES

    VaswaniConfig().custom_pipelines["translation"]["pt"].append("AutoModel")
    assert VaswaniConfig().custom_pipelines == CUSTOM_PIPELINES
    assert CUSTOM_PIPELINES["translation"]["pt"] == ["AutoModelForSeq2SeqLM"]


def test_config_round_trips_through_json(tmp_path):
    original = VaswaniConfig.big(vocab_size=1000, normalize_before=True)
    original.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text(encoding="utf-8"))
    assert saved["model_type"] == "vaswani" and saved["d_k"] == 64 and saved["normalize_before"] is True
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VaswaniConfig)
    assert loaded.to_diff_dict() | {"_name_or_path": ""} == original.to_diff_dict() | {"_name_or_path": ""}
    assert loaded.deviations() == original.deviations() == [PAPER_ARCHITECTURE["normalize_before"][1] +
                                                            " (`normalize_before=True`)"]


def test_registration_is_idempotent():
    vaswani_hf.register()
    vaswani_hf.register()
    config = AutoConfig.for_model("vaswani", vocab_size=40, d_model=8, d_ff=16, num_heads=2, num_layers=1)
    assert isinstance(config, VaswaniConfig)
    assert isinstance(AutoModel.from_config(config), VaswaniModel)
    assert isinstance(AutoModelForSeq2SeqLM.from_config(config), VaswaniForConditionalGeneration)


def test_the_papers_configs_have_no_deviations_and_each_option_names_itself():
    """The one list of deviations (PAPER_ARCHITECTURE), as the model cards print it: none for base and big, one line
    per option changed, naming it and its value; every architecture option that is not the paper's is in it."""
    assert VaswaniConfig().deviations() == [] == VaswaniConfig.big().deviations()
    changed = {"normalize_before": True, "tie_word_embeddings": False, "position_embedding": "learned",
               "scale_embedding": False, "attention_dropout": 0.1, "activation_dropout": 0.1,
               "activation_function": "swish", "add_final_logits_bias": True, "position_encoding_layout": "halves",
               "position_encoding_frequencies": "fairseq", "position_offset": 2, "layer_norm_eps": 1e-5}
    for name, value in changed.items():
        (line,) = VaswaniConfig(**{name: value}).deviations()
        assert line.endswith(f"(`{name}={value!r}`)"), line
    assert set(PAPER_ARCHITECTURE) == set(changed)
