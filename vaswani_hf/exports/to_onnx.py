"""Export to ONNX with torch's own exporter (`torch.onnx.export(..., dynamo=True)`): three graphs, as optimum lays
out encoder-decoder models, with the inputs and outputs named as optimum names them.

    encoder_model.onnx            input_ids, attention_mask -> last_hidden_state
    decoder_model.onnx            input_ids, encoder_hidden_states, encoder_attention_mask
                                  -> logits, present.{i}.decoder.key/value, present.{i}.encoder.key/value
    decoder_with_past_model.onnx  input_ids (one token), encoder_attention_mask, past_key_values.{i}.decoder.key/value,
                                  past_key_values.{i}.encoder.key/value -> logits, present.{i}.decoder.key/value

The first decoding step computes every layer's encoder-decoder keys and values once; later steps take them, with
the self-attention keys and values of the steps before, and return the latter grown by one position. Batch,
source, target and past lengths are dynamic. `onnx_runtime.py` decodes with these graphs in ONNX Runtime.
"""

import copy
import logging
import warnings
from pathlib import Path

import torch
from torch import nn
from transformers.cache_utils import DynamicCache, EncoderDecoderCache

SAMPLE_BATCH, SAMPLE_SOURCE, SAMPLE_TARGET = 2, 7, 3  # sizes of the example inputs the graphs are traced with


class Encoder(nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return self.model.get_encoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


class Decoder(nn.Module):
    """The first step: logits, and the self- and encoder-decoder attention keys and values of every layer."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_hidden_states, encoder_attention_mask):
        config = self.model.config.get_text_config(decoder=True)
        cache = EncoderDecoderCache(DynamicCache(config=config), DynamicCache(config=config))
        logits = self.model(encoder_outputs=(encoder_hidden_states,), attention_mask=encoder_attention_mask,
                            decoder_input_ids=input_ids, cache=cache, use_cache=True).logits
        pairs = zip(cache.self_attention_cache.layers, cache.cross_attention_cache.layers, strict=True)
        return logits, [(own.keys, own.values, cross.keys, cross.values) for own, cross in pairs]


class DecoderWithPast(nn.Module):
    """A later step: one token per row, the cached keys and values in; logits and the grown self-attention ones out."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, past):
        cache = EncoderDecoderCache([tuple(layer) for layer in past])  # cross-attention entries count as computed
        cross_keys = past[0][2]  # (B, h, S, d_k)
        # The decoder reads the encoder output only for its shape once the cross-attention cache is filled.
        placeholder = cross_keys.new_zeros(cross_keys.shape[0], cross_keys.shape[2], self.model.config.d_model)
        logits = self.model(encoder_outputs=(placeholder,), attention_mask=encoder_attention_mask,
                            decoder_input_ids=input_ids, cache=cache, use_cache=True).logits
        return logits, [(layer.keys, layer.values) for layer in cache.self_attention_cache.layers]


def layer_names(prefix: str, layers: int, kinds: tuple[str, ...]) -> list[str]:
    return [f"{prefix}.{i}.{kind}.{part}" for i in range(layers) for kind in kinds for part in ("key", "value")]


def export(model, tokenizer, output_dir) -> str:
    """Write the three graphs, the config, the generation config and the tokenizer to `output_dir`."""
    output_dir = Path(output_dir)
    model = copy.deepcopy(model).float()  # in eval mode with each graph's module, below
    # The formula's attention: ONNX Runtime takes its K^T into the product. torch's exporter writes SDPA as a transpose
    # and a scaling of all the cached keys at every step, which ONNX Runtime runs as copies (benchmarks/README.md).
    model.set_attn_implementation("eager")
    config = model.config
    layers, heads = config.num_decoder_layers, config.num_heads
    batch, source, target, past = (torch.export.Dim(name) for name in ("batch", "source", "target", "past"))
    ids = torch.randint(4, config.vocab_size, (SAMPLE_BATCH, SAMPLE_SOURCE))
    mask = torch.ones(SAMPLE_BATCH, SAMPLE_SOURCE, dtype=torch.long)
    hidden = torch.randn(SAMPLE_BATCH, SAMPLE_SOURCE, config.d_model)
    cached = [(torch.randn(SAMPLE_BATCH, heads, SAMPLE_TARGET, config.d_k),
               torch.randn(SAMPLE_BATCH, heads, SAMPLE_TARGET, config.d_v),
               torch.randn(SAMPLE_BATCH, heads, SAMPLE_SOURCE, config.d_k),
               torch.randn(SAMPLE_BATCH, heads, SAMPLE_SOURCE, config.d_v)) for _ in range(layers)]
    graphs = {
        "encoder_model": (Encoder(model), (ids, mask), ["input_ids", "attention_mask"], ["last_hidden_state"],
                          ({0: batch, 1: source}, {0: batch, 1: source})),
        "decoder_model": (
            Decoder(model), (ids[:, :SAMPLE_TARGET], hidden, mask),
            ["input_ids", "encoder_hidden_states", "encoder_attention_mask"],
            ["logits", *layer_names("present", layers, ("decoder", "encoder"))],
            ({0: batch, 1: target}, {0: batch, 1: source}, {0: batch, 1: source})),
        "decoder_with_past_model": (
            DecoderWithPast(model), (ids[:, :1], mask, cached),
            ["input_ids", "encoder_attention_mask", *layer_names("past_key_values", layers, ("decoder", "encoder"))],
            ["logits", *layer_names("present", layers, ("decoder",))],
            ({0: batch}, {0: batch, 1: source},
             [({0: batch, 2: past}, {0: batch, 2: past}, {0: batch, 2: source}, {0: batch, 2: source})] * layers)),
    }
    output_dir.mkdir(parents=True)
    # "torchvision is not installed. Skipping torchvision::nms" and its like, four lines per graph.
    logging.getLogger("torch.onnx._internal.exporter._registration").setLevel(logging.ERROR)
    for name, (module, inputs, input_names, output_names, dynamic_shapes) in graphs.items():
        with warnings.catch_warnings():  # notes from torch's exporter about itself, not about this model:
            warnings.filterwarnings("ignore", message=".*The axis name: .* will not be used", category=UserWarning)
            warnings.filterwarnings("ignore", message=".*isinstance\\(treespec, LeafSpec\\)", category=FutureWarning)
            torch.onnx.export(module.eval(), inputs, output_dir / f"{name}.onnx", dynamo=True, input_names=input_names,
                              output_names=output_names, dynamic_shapes=dynamic_shapes, verbose=False)
    config.save_pretrained(output_dir)
    model.generation_config.save_pretrained(output_dir)
    tokenizer.save_pretrained(output_dir)
    return str(output_dir)
