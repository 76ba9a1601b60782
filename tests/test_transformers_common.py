"""transformers' own ModelTesterMixin (test_modeling_common.py of the installed transformers version) run
against our model with a tiny config built from the paper's arguments.

The mixin comes from transformers' sdist on PyPI, fetched and cached on first use (`fetch_transformers_tests.py`).
Where it cannot be fetched this module fails, it does not skip. The sdist has no GenerationTesterMixin
(tests/generation/ is left out of it), so none runs here: tests/test_generation.py checks what its tests check that
concern this model (continuing from a returned cache, a fullgraph-compiled forward, no recompilation).
"""

import subprocess
import sys
import unittest
import warnings
from unittest import mock

import pytest
import torch
from fetch_transformers_tests import PACKAGE, TARGET, fetch

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration, VaswaniModel

try:
    fetch()
except subprocess.CalledProcessError as error:
    raise RuntimeError(f"transformers' common tests could not be fetched from PyPI into {PACKAGE}: {error}") from None
sys.path.insert(0, str(TARGET))

from transformers.models.auto.modeling_auto import MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, MODEL_MAPPING_NAMES
from transformers_tests.test_modeling_common import ModelTesterMixin, ids_tensor

pytestmark = pytest.mark.filterwarnings("ignore")


class VaswaniModelTester:
    """Characteristic sizes: d_model 16, 4 heads, d_ff 20, 2 layers each side, vocabulary 99."""

    def __init__(self, parent, batch_size=13, seq_length=7, vocab_size=99, is_training=True):
        self.parent = parent
        self.batch_size, self.seq_length, self.vocab_size = batch_size, seq_length, vocab_size
        self.is_training = is_training
        self.hidden_size, self.num_attention_heads, self.num_hidden_layers = 16, 4, 2
        self.encoder_seq_length = self.decoder_seq_length = self.key_length = seq_length

    def get_config(self) -> VaswaniConfig:
        return VaswaniConfig(
            vocab_size=self.vocab_size, d_model=self.hidden_size, d_ff=20, num_heads=self.num_attention_heads,
            num_layers=self.num_hidden_layers, dropout=0.1, attention_dropout=0.1,
            pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=0,
        )

    def prepare_config_and_inputs_for_common(self):
        input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        input_ids[:, -1] = 2
        decoder_input_ids = ids_tensor([self.batch_size, self.seq_length], self.vocab_size).clamp(3)
        inputs = {
            "input_ids": input_ids,
            "attention_mask": input_ids.ne(1),
            "decoder_input_ids": decoder_input_ids,
            "decoder_attention_mask": decoder_input_ids.ne(1),
        }
        return self.get_config(), inputs

    prepare_config_and_inputs = prepare_config_and_inputs_for_common


class VaswaniCommonTest(ModelTesterMixin, unittest.TestCase):
    all_model_classes = (VaswaniModel, VaswaniForConditionalGeneration)
    all_generative_model_classes = ()  # no GenerationTesterMixin to run them (module docstring), as the mixin asks
    is_encoder_decoder = True

    def setUp(self):
        self.model_tester = VaswaniModelTester(self)
        # The mixin picks its tests by transformers' own model names (the bare model, the seq2seq LM head): ours are
        # named among them for each test, as our registration with the Auto classes cannot name them there.
        for names, name in ((MODEL_MAPPING_NAMES, "VaswaniModel"),
                            (MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES, "VaswaniForConditionalGeneration")):
            self.enterContext(mock.patch.dict(names, {VaswaniConfig.model_type: name}))

    def test_bc_cache_name_forward(self):
        # The mixin records the FutureWarning that the old name `past_key_values` must raise: let it through this
        # module's "ignore".
        with warnings.catch_warnings():
            warnings.simplefilter("always", FutureWarning)
            super().test_bc_cache_name_forward()

    def test_the_mixin_is_the_installed_versions(self):
        import transformers

        assert f"transformers-tests/{transformers.__version__}" in str(PACKAGE)
        assert hasattr(ModelTesterMixin, "test_save_load") and hasattr(ModelTesterMixin, "test_tied_weights_keys")
        assert torch.is_tensor(ids_tensor([1, 2], 5))
