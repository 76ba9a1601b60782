"""Bad input gets a one-line ValueError that says what is wrong, not a stack trace from an embedding lookup."""

import os
import subprocess
import sys

import pytest
import torch
from support import BOS, random_ids, tiny_model


def one_line_error(call, *fragments):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert "\n" not in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def target():
    return torch.tensor([[BOS, 5, 6]])


def test_source_ids_outside_the_vocabulary(model):
    one_line_error(lambda: model(input_ids=torch.tensor([[5, 53]]), decoder_input_ids=target()),
                   "input_ids", "[0, 53)", "53")
    negative = one_line_error(lambda: model(input_ids=torch.tensor([[5, -1]]), decoder_input_ids=target()),
                              "input_ids", "-1")
    assert "labels" not in negative  # the -100 hint is for -100 alone


def test_decoder_ids_outside_the_vocabulary_and_minus_100_mixups(model):
    one_line_error(lambda: model(input_ids=random_ids(1, 4), decoder_input_ids=torch.tensor([[BOS, 99]])),
                   "decoder_input_ids", "99")
    one_line_error(lambda: model(input_ids=random_ids(1, 4), decoder_input_ids=torch.tensor([[BOS, -100]])),
                   "decoder_input_ids", "labels")


def test_labels_outside_the_vocabulary(model):
    one_line_error(lambda: model(input_ids=random_ids(1, 4), labels=torch.tensor([[5, 77]])), "77")


def test_labels_that_do_not_fit_the_given_decoder_inputs(model):
    one_line_error(lambda: model(input_ids=random_ids(1, 4), decoder_input_ids=target(),
                                 labels=torch.tensor([[5, 6]])),
                   "labels have shape (1, 2) but the decoder produced (1, 3)")


def test_a_mask_whose_shape_does_not_match_the_ids(model):
    one_line_error(lambda: model(input_ids=random_ids(2, 5), attention_mask=torch.ones(2, 4),
                                 decoder_input_ids=target().repeat(2, 1)),
                   "attention_mask", "(2, 4)", "(2, 5)")
    one_line_error(lambda: model(input_ids=random_ids(1, 5), decoder_input_ids=target(),
                                 decoder_attention_mask=torch.ones(1, 2)),
                   "decoder_attention_mask", "(1, 3)")
    one_line_error(lambda: model(input_ids=random_ids(2, 5), decoder_input_ids=target().repeat(3, 1)),
                   "decoder has 3 rows", "encoder output 2")
    one_line_error(lambda: model.get_encoder()(input_ids=random_ids(2, 5), attention_mask=torch.ones(2, 4)),
                   "attention_mask", "(2, 4)", "(2, 5)")
    encoded = model.get_encoder()(input_ids=random_ids(2, 5))  # generate() encodes once, then passes this
    one_line_error(lambda: model(encoder_outputs=encoded, attention_mask=torch.ones(2, 4),
                                 decoder_input_ids=target().repeat(2, 1)),
                   "attention_mask", "(2, 4)", "(2, 5)")


def test_empty_sequences(model):
    one_line_error(lambda: model(input_ids=torch.zeros(1, 0, dtype=torch.long), decoder_input_ids=target()),
                   "input_ids", "empty")
    one_line_error(lambda: model(input_ids=random_ids(1, 4), decoder_input_ids=torch.zeros(1, 0, dtype=torch.long)),
                   "decoder_input_ids", "empty")
    one_line_error(lambda: model.generate(torch.zeros(1, 0, dtype=torch.long)), "empty")
    one_line_error(lambda: model(inputs_embeds=torch.zeros(1, 0, 24), decoder_input_ids=target()),
                   "inputs_embeds must have shape (batch, length >= 1, d_model=24), got (1, 0, 24)")
    one_line_error(lambda: model.generate(torch.zeros(0, 3, dtype=torch.long), gnmt_alpha=0.6, num_beams=4),
                   "input_ids is empty (shape (0, 3))")


def test_wrong_ranks_and_types(model):
    one_line_error(lambda: model(input_ids=torch.tensor([5, 6, 7]), decoder_input_ids=target()),
                   "input_ids", "(batch, length)")
    one_line_error(lambda: model(input_ids=torch.tensor([[5.0, 6.0]]), decoder_input_ids=target()), "integer")
    one_line_error(lambda: model(input_ids=random_ids(1, 3), labels=torch.tensor([5, 6, 2])),
                   "labels must have shape (batch, length), got shape (3,)")
    one_line_error(lambda: model(input_ids=random_ids(1, 3), labels=torch.tensor([[5.0, 2.0]])),
                   "labels must hold integer token ids")
    one_line_error(lambda: model(inputs_embeds=torch.zeros(1, 3, 7), decoder_input_ids=target()), "d_model=24")
    one_line_error(lambda: model(input_ids=random_ids(1, 3), inputs_embeds=torch.zeros(1, 3, 24),
                                 decoder_input_ids=target()),
                   "exactly one")


def test_generate_with_ids_outside_the_vocabulary(model):
    one_line_error(lambda: model.generate(torch.tensor([[5, 1000]]), max_new_tokens=2), "1000")


def test_generate_with_no_beams(model):
    one_line_error(lambda: model.generate(random_ids(1, 4), gnmt_alpha=0.6, num_beams=0),
                   "generate(): num_beams must be a whole number of at least 1, got 0")


@pytest.mark.parametrize("eos", [None, [2, 3]])
def test_the_papers_search_needs_one_eos_id(eos):
    """Without one (None: it returned padding alone; several: none ended a hypothesis), one line."""
    model = tiny_model(eos_token_id=eos)
    one_line_error(lambda: model.generate(random_ids(2, 4), num_beams=4, gnmt_alpha=0.6),
                   f"the paper's search ends hypotheses at one eos_token_id, the model has {eos}")


@pytest.mark.parametrize(("settings", "message"), [
    ({"gnmt_alpha": float("nan")}, "gnmt_alpha must be a finite number of at least 0, got nan"),
    ({"gnmt_alpha": float("inf")}, "gnmt_alpha must be a finite number of at least 0, got inf"),
    ({"gnmt_alpha": -0.5}, "gnmt_alpha must be a finite number of at least 0, got -0.5"),  # lp would shrink
    ({"gnmt_alpha": "0.6"}, "gnmt_alpha must be a finite number of at least 0, got '0.6'"),
    ({"num_beams": 2.5}, "num_beams must be a whole number of at least 1, got 2.5"),
    ({"num_beams": "4"}, "num_beams must be a whole number of at least 1, got '4'"),
    ({"num_return_sequences": 0}, "num_return_sequences must be a whole number of at least 1, got 0"),
    ({"min_new_tokens": 1.5}, "min_new_tokens must be a whole number of at least 0, got 1.5"),
    ({"max_new_tokens": 2.5}, "max_new_tokens (max_length counts the decoder start token) must be a whole number"),
    ({"max_length": 1}, "the decoder start token) must be a whole number of at least 1, got 0"),
    ({"num_return_sequences": True}, "num_return_sequences must be a whole number of at least 1, got True"),
    ({"extra_length": -1}, "generate(): extra_length must be a whole number of at least 0, got -1"),
    ({"gnmt_alpha": None, "extra_length": 5}, "generate(): extra_length limits the paper's decoding (gnmt_alpha)"),
])
def test_the_papers_search_refuses_settings_it_cannot_honour_in_one_line(model, settings, message):
    """An α that is not a finite number >= 0 (the early stop assumes lp grows with length; NaN decoded nothing but
    padding, infinity tied every hypothesis), counts that are not whole numbers, no token to make: before, nonsense
    (padding alone for max_new_tokens=2.5, one sequence for num_return_sequences=0) or a traceback."""
    one_line_error(lambda: model.generate(random_ids(2, 4), **{"num_beams": 4, "gnmt_alpha": 0.6, **settings}),
                   message)


def test_the_search_itself_refuses_a_negative_extra_length_and_a_saved_0_means_0():
    from types import SimpleNamespace

    from vaswani_hf.gnmt import extra_length_of, gnmt_beam_search

    one_line_error(lambda: gnmt_beam_search(tiny_model(), random_ids(1, 4), extra_length=-1),
                   "extra_length must be a whole number of at least 0, got -1")
    assert extra_length_of(SimpleNamespace(extra_length=0)) == 0 and extra_length_of(SimpleNamespace()) == 50


def test_generate_reads_the_ids_values_once_per_sequence_start_not_at_every_step(model, monkeypatch):
    """Reading the least and greatest id makes the host wait for a GPU: once for the source and once for the decoder's
    first step, however many tokens follow (the later steps feed back the model's own choices)."""
    from vaswani_hf import modeling_vaswani

    reads = []
    check = modeling_vaswani.check_token_ids

    def counted(ids, *args, **kwargs):
        if kwargs.get("values", True):
            reads.append(tuple(ids.shape))
        return check(ids, *args, **kwargs)

    monkeypatch.setattr(modeling_vaswani, "check_token_ids", counted)
    for new_tokens in (3, 9):
        reads.clear()
        output = model.generate(random_ids(2, 5), num_beams=1, max_new_tokens=new_tokens, min_new_tokens=new_tokens)
        assert output.shape[1] == new_tokens + 1
        assert reads == [(2, 5), (2, 1)], reads


@pytest.mark.parametrize("version, loaded", [("5.23.0", "the package"), ("4.57.1", "a folder's own code")])
def test_loading_the_model_with_a_transformers_older_than_it_speaks_is_refused_in_one_line(tmp_path, version, loaded,
                                                                                          translation_folder):
    """The model speaks transformers 5.24's `cache`; under 5.23 generate() would pass `past_key_values`, and 4.x
    lacks modules the model's file imports. An installed older version is stood in for by its metadata, first on
    the path: importing the package, or loading a saved folder's own code (trust_remote_code), is refused in one
    line naming the version, by the configuration's file, which loads first, before the model's file is imported."""
    metadata = tmp_path / f"transformers-{version}.dist-info" / "METADATA"
    metadata.parent.mkdir()
    metadata.write_text(f"Metadata-Version: 2.1\nName: transformers\nVersion: {version}\n", encoding="utf-8")
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
                   "HF_MODULES_CACHE": str(tmp_path / "modules")}
    code = {"the package": "import vaswani_hf", "a folder's own code": (
        "from transformers import AutoModelForSeq2SeqLM; "
        f"AutoModelForSeq2SeqLM.from_pretrained({str(translation_folder)!r}, trust_remote_code=True)")}[loaded]
    result = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=300,
                            env=environment)
    assert result.returncode != 0
    assert result.stderr.strip().splitlines()[-1] == (
        "ImportError: transformers>=5.24 is required for a normal functioning of this module, but found"
        f" transformers=={version}.")
    assert "configuration_vaswani.py" in result.stderr and "modeling_vaswani.py" not in result.stderr
