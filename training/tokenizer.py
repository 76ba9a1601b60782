"""§5.1: "Sentences were encoded using byte-pair encoding, which has a shared source-target vocabulary of about
37000 tokens." A joint BPE trained with `tokenizers`, saved as a fast tokenizer that `AutoTokenizer` loads.

The text is normalized first (`normalizer`), as SentencePiece and the Moses scripts normalize theirs: NFKC, and white
space as single spaces between words, so that a tab, a line break or a double space in a source gives the tokens of
one space (the paper does not say). A tokenizer of NFKC alone, as earlier runs saved, is read as it is.
"""

import json
from collections.abc import Iterable, Iterator

import datasets
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

# The ids of VaswaniConfig's defaults: pad 0, bos (decoder start) 1, eos 2.
SPECIAL_TOKENS = ["<pad>", "<s>", "</s>", "<unk>"]


def train_joint_bpe(texts: Iterable[str], vocab_size: int) -> PreTrainedTokenizerFast:
    """One BPE over source and target text. Encoding appends </s>; decoding restores the spaces."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.normalizer = normalizer()
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    tokenizer.post_processor = eos_appended(tokenizer.token_to_id("</s>"))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def normalizer(spaces: bool = True) -> normalizers.Normalizer:
    """NFKC, then (`spaces`) each run of white space (Unicode's: tabs, line breaks, ...) one space, none at either
    end."""
    if not spaces:  # earlier runs' tokenizers
        return normalizers.NFKC()
    return normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Strip()])


def eos_appended(eos_id: int) -> processors.TemplateProcessing:
    return processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", eos_id)])


def is_joint_bpe(backend: Tokenizer) -> bool:
    """Whether a Rust tokenizer has `train_joint_bpe`'s pipeline (`normalizer`, with or without its spaces; Metaspace,
    BPE without dropout, </s> appended), whatever its vocabulary."""
    spec, eos_id = json.loads(backend.to_str()), backend.token_to_id("</s>")
    if eos_id is None or spec["model"]["type"] != "BPE" or spec["model"]["dropout"] is not None:
        return False
    reference = Tokenizer(models.BPE())
    reference.pre_tokenizer, reference.post_processor = pre_tokenizers.Metaspace(), eos_appended(eos_id)
    expected = json.loads(reference.to_str())
    return spec["normalizer"] in (json.loads(normalizer(spaces).__getstate__()) for spaces in (True, False)) and all(
        spec[part] == expected[part] for part in ("pre_tokenizer", "post_processor"))


def corpus_texts(rows: datasets.Dataset | datasets.IterableDataset, sample: int | None = None,
                 seed: int = 0) -> Iterator[str]:
    """The source and the target of each pair of `rows`, in order, or of `sample` pairs drawn at random (a stream's
    first `sample`): what `train_joint_bpe` reads, a thousand pairs at a time, never the whole corpus at once."""
    if isinstance(rows, datasets.IterableDataset):
        rows = rows.take(sample) if sample is not None else rows
    elif sample is not None and sample < len(rows):
        rows = rows.shuffle(seed=seed).select(range(sample))
    for batch in rows.iter(batch_size=1000):
        for source, target in zip(batch["source"], batch["target"]):
            yield source
            yield target
