"""Decoding with the graphs `vaswani-export onnx` writes (to_onnx.py), in ONNX Runtime.

    from vaswani_hf.exports.onnx_runtime import OnnxSeq2Seq

    model = OnnxSeq2Seq("onnx-model")                       # the exported folder: graphs, config, tokenizer
    print(model.translate(["A man is riding a bike."]))      # the paper's beam search (gnmt.py), beam 4, α 0.6
    print(model.translate(["A man is riding a bike."], num_beams=1))   # greedy, as vaswani-translate's

`score(model, model.tokenizer, sources, translations)` (translate.py's) gives each translation's log P.

`OnnxSeq2Seq` answers the calls the paper's beam search makes of a model (`get_encoder()`, a forward step with
transformers' `EncoderDecoderCache`), so `gnmt_beam_search` runs on ONNX Runtime unchanged; `greedy` is
generate(num_beams=1)'s loop. The cache holds the graphs' keys and values as torch tensors sharing memory with ONNX
Runtime's arrays, so that the search can reorder them between beams.
"""

from functools import cached_property
from pathlib import Path
from types import SimpleNamespace

import onnxruntime
import torch
from transformers import AutoConfig, AutoTokenizer, GenerationConfig, GenerationMixin
from transformers.cache_utils import DynamicCache, DynamicLayer, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from ..gnmt import extra_length_of, output_limits
from ..modeling_vaswani import shift_tokens_right
from ..tools.loading import PAPERS_ALPHA, learned_positions
from ..tools.translate import MAX_TOKENS, decoded_batch, log_p, scoring_batch, translate


class OnnxSeq2Seq:
    """The three exported graphs in ONNX Runtime sessions, with the folder's config and tokenizer."""

    # What gnmt.py's `logits_processors` and `stopping_criteria_of` call of a model to build the generation config's
    # processors (an OPUS-MT model's banned <pad>) and stop strings: transformers' own.
    _prepare_special_tokens = GenerationMixin._prepare_special_tokens
    _get_logits_processor = GenerationMixin._get_logits_processor
    _get_stopping_criteria = GenerationMixin._get_stopping_criteria
    _merge_criteria_processor_list = GenerationMixin._merge_criteria_processor_list

    def __init__(self, folder, providers: list[str] | None = None, threads: int | None = None):
        folder = Path(folder)
        options = onnxruntime.SessionOptions()
        # Between two runs the decoding loop works in torch on the same cores (the next token, the beams' order):
        # ONNX Runtime's workers, spinning there by default, would take them from it (benchmarks/README.md).
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        if threads:
            options.intra_op_num_threads = threads
        providers = providers or ["CPUExecutionProvider"]
        self.sessions = {name: onnxruntime.InferenceSession(str(folder / f"{name}.onnx"), options, providers=providers)
                         for name in ("encoder_model", "decoder_model", "decoder_with_past_model")}
        self.config = AutoConfig.from_pretrained(folder)
        self.generation_config = GenerationConfig.from_pretrained(folder)
        self.folder, self.layers = folder, self.config.num_decoder_layers
        self.positions = learned_positions(self.config)  # as translate.py's engines

    @cached_property
    def tokenizer(self):
        """The folder's tokenizer, read when `translate` first needs it (the ids-level calls do not)."""
        return AutoTokenizer.from_pretrained(self.folder)

    def get_encoder(self):
        def encode(input_ids, attention_mask):
            (hidden,) = self.sessions["encoder_model"].run(None, {"input_ids": input_ids.numpy(),
                                                                  "attention_mask": attention_mask.long().numpy()})
            return BaseModelOutput(last_hidden_state=torch.from_numpy(hidden))

        return encode

    def __call__(self, encoder_outputs, attention_mask, decoder_input_ids, cache, use_cache=True):
        """One decoding step, one encoder row per decoder row: the first fills `cache` (self and encoder-decoder
        attention), later ones take one token per row and grow the self-attention entries."""
        mask = attention_mask.long().numpy()
        own, cross = cache.self_attention_cache, cache.cross_attention_cache
        if cache.get_seq_length() == 0:
            hidden = encoder_outputs.last_hidden_state.numpy()
            inputs = {"input_ids": decoder_input_ids.numpy(), "encoder_hidden_states": hidden,
                      "encoder_attention_mask": mask}
            logits, *present = self.sessions["decoder_model"].run(None, inputs)
            # The graphs take the keys as contiguous arrays and grow them themselves: transformers' layers, not the
            # search's (gnmt.BeamLayer), whose reordered keys are views that would be copied once more to be fed.
            own.layers = [DynamicLayer() for _ in range(self.layers)]
            for i in range(self.layers):
                keys, values, cross_keys, cross_values = (torch.from_numpy(a) for a in present[4 * i : 4 * i + 4])
                own.update(keys, values, i)
                cross.update(cross_keys, cross_values, i)
        else:
            feeds = {"input_ids": decoder_input_ids.numpy(), "encoder_attention_mask": mask}
            for i in range(self.layers):
                for kind, layer in (("decoder", own.layers[i]), ("encoder", cross.layers[i])):
                    feeds[f"past_key_values.{i}.{kind}.key"] = layer.keys.contiguous().numpy()
                    feeds[f"past_key_values.{i}.{kind}.value"] = layer.values.contiguous().numpy()
            logits, *present = self.sessions["decoder_with_past_model"].run(None, feeds)
            for i in range(self.layers):
                own.layers[i].keys, own.layers[i].values = (torch.from_numpy(a) for a in present[2 * i : 2 * i + 2])
        return SimpleNamespace(logits=torch.from_numpy(logits))

    def new_cache(self) -> EncoderDecoderCache:
        config = self.config.get_text_config(decoder=True)
        return EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))

    def greedy(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, max_new_tokens: int | None = None):
        """The most probable token at each step until EOS, at most `max_new_tokens` (default: the longest source
        + the generation config's `extra_length`, else 50, as `generate()`; never past learned positions, as the
        paper's search); (B, T) ids from the start token, PAD after EOS. Where the folder's generation config asks for
        the paper's decoding (`gnmt_alpha`), the first token is not EOS, as `generate()` and the paper's search decode
        it (gnmt.py)."""
        config = self.config
        extra_length = extra_length_of(self.generation_config)
        limit = int(output_limits(config, attention_mask, max_new_tokens, extra_length).max())
        hidden, cache = self.get_encoder()(input_ids, attention_mask), self.new_cache()
        tokens = torch.full((input_ids.shape[0], 1), config.decoder_start_token_id)
        ended = torch.zeros(input_ids.shape[0], dtype=torch.bool)
        papers = getattr(self.generation_config, "gnmt_alpha", None) is not None
        for step in range(limit):
            logits = self(hidden, attention_mask, tokens[:, -1:], cache).logits[:, -1]
            if step == 0 and papers:
                logits[:, config.eos_token_id] = -torch.inf
            chosen = logits.argmax(-1).masked_fill(ended, config.pad_token_id)
            tokens = torch.cat([tokens, chosen[:, None]], dim=-1)
            ended |= chosen == config.eos_token_id
            if ended.all():
                break
        return tokens

    def translate(self, sources: list[str], num_beams: int | None = None, alpha: float | None = None,
                  max_tokens: int = MAX_TOKENS) -> list[str]:
        """Translations of `sources`, in order, as vaswani-translate decodes them (translate.py's `translate`, this
        object its engine): in batches of at most `max_tokens` source tokens, padding included, by the paper's beam
        search with the folder's beam size and GNMT α (else 4 and 0.6), each output limited by its own source's
        length, one beam too; a blank source's is "". A source longer than the model's learned positions is refused
        before any is decoded."""
        return translate(self, self.tokenizer, sources, max_tokens, num_beams, alpha)

    def decode(self, batch: list[list[int]], num_beams: int, alpha: float | None,
               nbest: int) -> tuple[list[list[int]], list[float]]:
        """translate.py's engine call: the paper's search, with α 0.6 where none is given (ONNX Runtime runs no
        other decoding)."""
        return decoded_batch(self, self.tokenizer, batch, num_beams, PAPERS_ALPHA if alpha is None else alpha, nbest)

    def score(self, sources: list[list[int]], targets: list[list[int]]) -> list[float]:
        """translate.py's engine call for `score`: each target's log P given its source, the first step's graph
        reading it whole."""
        source, mask, labels = scoring_batch(self.tokenizer, sources, targets)
        hidden = self.get_encoder()(source, mask).last_hidden_state
        inputs = shift_tokens_right(labels, self.config.pad_token_id, self.config.decoder_start_token_id)
        logits, *_ = self.sessions["decoder_model"].run(None, {"input_ids": inputs.numpy(), "encoder_hidden_states":
                                                               hidden.numpy(), "encoder_attention_mask": mask.numpy()})
        return log_p(torch.from_numpy(logits), labels)
