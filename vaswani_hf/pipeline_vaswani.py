# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""`pipeline("translation")` for transformers 5, which removed the task.

This file travels to the Hub beside the weights (every saved config names it under `custom_pipelines`), so that
`pipeline("translation", model=folder_or_repo, trust_remote_code=True)` works without vaswani_hf installed. On
model objects (package installed): `TranslationPipeline(model=model, tokenizer=tokenizer)`; transformers 5 rejects
the task name "translation" in `pipeline()` unless a model folder's config declares it. It imports only torch and
transformers.
"""

from collections.abc import Iterator, Sequence

import torch
from transformers import Pipeline
from transformers.utils import logging

logger = logging.get_logger(__name__)

TRUNCATION = {"longest_first": True, "only_first": True, "do_not_truncate": False}  # a source is one sequence
TAKES = "a string, a list of strings or a stream of them (an iterator, a torch Dataset such as KeyDataset)"

# What `VaswaniConfig` writes into every config.json.
CUSTOM_PIPELINES = {
    "translation": {"impl": "pipeline_vaswani.TranslationPipeline", "pt": ["AutoModelForSeq2SeqLM"], "type": "text"}
}


class TranslationPipeline(Pipeline):
    """Strings in, `[{"translation_text": ...}]` out, decoded by the model's own `generate()`.

    For a model saved by `training/run.py` and loaded with `trust_remote_code=True` that is the paper's decoding
    (§6.1: beam search with the GNMT length penalty, source length + 50) with the beam size, α and limit the run saved.
    Generation keyword arguments (`num_beams`, `max_new_tokens`, `num_return_sequences`, ...) pass through, at
    construction or per call; `batch_size` batches the inputs. Sources longer than `max_input_length` tokens
    (default: the model's `max_position_embeddings`) are truncated with a warning instead of failing; with
    `truncation=True` without one, with `truncation=False` not at all (transformers 4's pipeline's argument).

    A single string gives a list with one dict per returned sequence; a list of strings (a tuple, a dataset's column)
    gives one such result per string (flattened to one dict each when one sequence is returned, as in transformers 4).
    A stream, an iterator or a torch Dataset (`KeyDataset(dataset, "en")`), is translated as it is read: the call
    returns an iterable of each string's list, as transformers' pipelines stream theirs. `return_tensors=True`
    gives each sequence's ids as `generate()` returns them (`translation_token_ids`) in place of its text, and with
    `return_text=True` both, as transformers 4's pipeline did. A blank string translates to "" (no ids), as a blank
    line does in `vaswani-translate`. `src_lang` and `tgt_lang` (transformers 4's, for multilingual models) are
    refused: the model translates one pair.
    """

    _pipeline_calls_generate = True
    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_feature_extractor = False
    _load_video_processor = False

    def _sanitize_parameters(self, max_input_length=None, truncation=None, return_tensors=None, return_text=None,
                             skip_special_tokens=None, clean_up_tokenization_spaces=None, src_lang=None,
                             tgt_lang=None, **generate_kwargs):
        if src_lang is not None or tgt_lang is not None:  # transformers 4's, for multilingual tokenizers
            raise ValueError("src_lang and tgt_lang choose the languages of a multilingual model; this model "
                             "translates the one pair it was trained on: leave them out")
        if max_input_length is not None and (type(max_input_length) is not int or max_input_length < 1):
            raise ValueError(f"max_input_length must be a whole number of at least 1, got {max_input_length!r}")
        if truncation is not None and not isinstance(truncation, bool):
            truncation = TRUNCATION.get(truncation)  # transformers 4's strategies (a TruncationStrategy is a str)
            if truncation is None:
                raise ValueError(f"truncation must be True, False or one of {sorted(TRUNCATION)}")
        preprocess_params = {key: value for key, value in (("max_input_length", max_input_length),
                                                            ("truncation", truncation)) if value is not None}
        postprocess_params = {
            key: value
            for key, value in (("return_tensors", return_tensors), ("return_text", return_text),
                               ("skip_special_tokens", skip_special_tokens),
                               ("clean_up_tokenization_spaces", clean_up_tokenization_spaces))
            if value is not None
        }
        # as transformers' pipelines take them: keywords, or a dict (its `generate_kwargs`), the keywords winning
        generate_kwargs = {**(generate_kwargs.pop("generate_kwargs", None) or {}), **generate_kwargs}
        return preprocess_params, generate_kwargs, postprocess_params

    def __call__(self, inputs, **kwargs):
        if isinstance(inputs, torch.utils.data.Dataset):  # KeyDataset(dataset, "en"): transformers streams it
            return super().__call__(inputs, **kwargs)
        if isinstance(inputs, Iterator):  # transformers streams a generator
            return super().__call__((text for text in inputs), **kwargs)
        if not isinstance(inputs, (str, Sequence)):
            raise TypeError(f"TranslationPipeline takes {TAKES}, got {type(inputs).__name__}")
        texts = [inputs] if isinstance(inputs, str) else list(inputs)  # a list, a tuple, a dataset's column
        others = [type(text).__name__ for text in texts if not isinstance(text, str)]
        if others:
            raise TypeError(f"TranslationPipeline takes {TAKES}, got a {type(inputs).__name__} holding {others[0]}")
        if not texts:  # nothing to translate: transformers' Pipeline would look for a first item
            return []
        results = super().__call__(inputs if isinstance(inputs, str) else texts, **kwargs)
        if not isinstance(inputs, str) and all(len(result) == 1 for result in results):
            return [result[0] for result in results]
        return results

    def preprocess(self, text: str, max_input_length: int | None = None, truncation: bool | None = None) -> dict:
        if not isinstance(text, str):  # an item of a stream, met as it is read
            raise TypeError(f"TranslationPipeline takes {TAKES}, got a stream holding {type(text).__name__}")
        limit = max_input_length
        if limit is None:
            limit = getattr(self.model.config, "max_position_embeddings", None)
        encoded = self.tokenizer(text, return_tensors="pt")
        if limit is not None and encoded["input_ids"].shape[1] > limit and truncation is not False:
            if truncation is None:  # not asked for
                length = encoded["input_ids"].shape[1]
                logger.warning(f"a source of {length} tokens was truncated to {limit} (max_input_length)")
            encoded = self.tokenizer(text, return_tensors="pt", truncation=True, max_length=limit)
        return {"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
                "blank": not text.strip()}

    def _forward(self, model_inputs: dict, **generate_kwargs) -> dict:
        generate_kwargs = self._prepare_generate_kwargs(generate_kwargs)
        blank = model_inputs.pop("blank")  # a bool, or one per source when batched
        output_ids = self.model.generate(**model_inputs, **generate_kwargs)
        batch_size = model_inputs["input_ids"].shape[0]
        output_ids = output_ids.reshape(batch_size, -1, output_ids.shape[-1])  # (B, sequences, L)
        return {"output_ids": output_ids, "blank": blank}

    def postprocess(self, model_outputs: dict, return_tensors: bool = False, return_text: bool | None = None,
                    skip_special_tokens: bool = True, clean_up_tokenization_spaces: bool = False) -> list[dict]:
        output_ids: torch.Tensor = model_outputs["output_ids"][0]  # (sequences, L)
        if model_outputs["blank"]:
            output_ids = output_ids[:, :0]
        records = [{"translation_token_ids": ids} if return_tensors else {} for ids in output_ids]
        if return_text or (return_text is None and not return_tensors):
            texts = self.tokenizer.batch_decode(output_ids, skip_special_tokens=skip_special_tokens,
                                                clean_up_tokenization_spaces=clean_up_tokenization_spaces)
            for record, text in zip(records, texts):
                record["translation_text"] = text
        return records
