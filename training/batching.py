"""§5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch contained a
set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."

Batches are built from token counts, not sentence counts: pairs are sorted by length (ties broken at random
per epoch), cut into batches whose padded size — pairs × longest side — stays within `max_tokens`, and the
batches are shuffled. The order depends only on (seed, epoch), so every process builds the same list and takes
its share, and a resumed run sees the same batches.
"""

import random

import torch


def token_batches(source_lengths: list[int], target_lengths: list[int], max_tokens: int, seed: int,
                  epoch: int) -> list[list[int]]:
    """Lists of pair indices. A pair longer than max_tokens on its own is a batch of one."""
    rng = random.Random(seed * 1_000_003 + epoch)
    noise = [rng.random() for _ in source_lengths]
    order = sorted(range(len(source_lengths)),
                   key=lambda i: (max(source_lengths[i], target_lengths[i]), source_lengths[i], noise[i]))
    batches, batch, longest = [], [], 0
    for index in order:
        length = max(source_lengths[index], target_lengths[index])
        if batch and (len(batch) + 1) * max(longest, length) > max_tokens:
            batches.append(batch)
            batch, longest = [], 0
        batch.append(index)
        longest = max(longest, length)
    if batch:
        batches.append(batch)
    rng.shuffle(batches)
    return batches


def padding_fraction(batches: list[list[int]], source_lengths: list[int], target_lengths: list[int]) -> float:
    """The share of padding in the padded source and target tensors of these batches."""
    real = padded = 0
    for batch in batches:
        for lengths in (source_lengths, target_lengths):
            real += sum(lengths[i] for i in batch)
            padded += len(batch) * max(lengths[i] for i in batch)
    return 1 - real / padded if padded else 0.0


def encode(tokenizer, pairs, max_length=None):
    """Token ids of sources and targets; both end with </s>."""
    sources = tokenizer([s for s, _ in pairs])["input_ids"]
    targets = tokenizer([t for _, t in pairs])["input_ids"]
    if max_length:
        kept = [i for i in range(len(pairs)) if len(sources[i]) <= max_length and len(targets[i]) <= max_length]
        sources, targets = [sources[i] for i in kept], [targets[i] for i in kept]
    return sources, targets


def collate(indices, sources, targets, pad_id, device):
    """Right-padded source ids and mask, and labels with -100 at padding (the model shifts them itself)."""
    source_width = max(len(sources[i]) for i in indices)
    target_width = max(len(targets[i]) for i in indices)
    input_ids = torch.full((len(indices), source_width), pad_id)
    labels = torch.full((len(indices), target_width), -100)
    for row, i in enumerate(indices):
        input_ids[row, : len(sources[i])] = torch.tensor(sources[i])
        labels[row, : len(targets[i])] = torch.tensor(targets[i])
    return {"input_ids": input_ids.to(device), "attention_mask": input_ids.ne(pad_id).long().to(device),
            "labels": labels.to(device)}
