"""§5.1: "Sentence pairs were batched together by approximate sequence length. Each training batch contained a
set of sentence pairs containing approximately 25000 source tokens and 25000 target tokens."

Batches are built from token counts, not sentence counts: pairs are sorted by length (ties broken at random
per epoch), cut into batches whose padded size — pairs × longest side — stays within `max_tokens`, and the
batches are shuffled. The order depends only on (seed, epoch), so every process builds the same list and takes
its share, and a resumed run sees the same batches.
"""

import random

import numpy as np
import torch


def token_batches(source_lengths, target_lengths, max_tokens: int, seed: int, epoch: int) -> list[np.ndarray]:
    """Arrays of pair indices, from the pairs' token counts (sequences or arrays). A pair longer than max_tokens on
    its own is a batch of one. Vectorized over the pairs: one Python step per distinct length, not per pair."""
    source, target = np.asarray(source_lengths), np.asarray(target_lengths)
    if not len(source):  # (a streamed buffer whose pairs are all too long)
        return []
    rng = random.Random(seed * 1_000_003 + epoch)
    shuffled = np.argsort(random_draws(rng, len(source)))
    longest = np.maximum(source, target)
    # By the longer side, then the source, ties at random: a stable sort of the shuffled pairs by one key that orders
    # as (longer side, source) does — source <= longer side, so each longer side L takes the keys L(L+1)/2 + [0, L].
    # Below 2^16 (sides up to 360 tokens), numpy sorts the keys by radix.
    top = int(longest.max(initial=0))
    key = longest.astype(np.int64) * (longest + 1) // 2 + source
    key = key.astype(np.uint16 if top * (top + 1) // 2 + top < 2**16 else np.int64)
    order = shuffled[np.argsort(key[shuffled], kind="stable")].astype(np.int32 if len(source) < 2**31 else np.int64)
    del shuffled, key
    # Greedy, in sorted order: a pair joins the open batch while (its pairs + 1) x (the longest) fits. Sorted, the
    # pairs of one length come together, so the sizes follow per length: one Python step per distinct length.
    sorted_longest = longest[order]
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_longest)) + 1]
    sizes, open_pairs = [], 0
    for length, count in zip(sorted_longest[starts].tolist(), np.diff(np.r_[starts, len(order)]).tolist()):
        capacity = max(1, max_tokens // max(length, 1))  # pairs of this length in one batch (a longer pair: alone)
        if open_pairs:
            joining = min(count, max(0, capacity - open_pairs))
            open_pairs, count = open_pairs + joining, count - joining
            if not count:
                continue
            sizes.append(open_pairs)
        sizes += [capacity] * (count // capacity)
        open_pairs = count % capacity
    if open_pairs:
        sizes.append(open_pairs)
    batches = np.split(order, np.cumsum(sizes)[:-1]) if sizes else []
    rng.shuffle(batches)
    return batches


def random_draws(rng: random.Random, count: int) -> np.ndarray:
    """What `count` calls of `rng.random()` return, drawn at once, and `rng` moved past them: numpy's legacy Mersenne
    Twister, given CPython's state, makes each double from two 32-bit words as CPython does."""
    version, state, gauss = rng.getstate()
    twister = np.random.RandomState()
    twister.set_state(("MT19937", np.array(state[:-1], np.uint32), state[-1]))
    draws = twister.random_sample(count)
    _, words, position, *_ = twister.get_state()
    rng.setstate((version, (*words.tolist(), position), gauss))
    return draws


def padding_fraction(batches: list[np.ndarray], source_lengths, target_lengths) -> float:
    """The share of padding in the padded source and target tensors of these batches."""
    if not batches:
        return 0.0
    starts = np.cumsum([0] + [len(batch) for batch in batches[:-1]])
    pairs = np.concatenate(batches)
    real = padded = 0
    for lengths in (np.asarray(source_lengths)[pairs], np.asarray(target_lengths)[pairs]):
        real += int(lengths.sum(dtype=np.int64))
        longest = np.maximum.reduceat(lengths, starts).astype(np.int64)
        padded += int((longest * np.diff(np.r_[starts, len(pairs)])).sum())
    return 1 - real / padded if padded else 0.0


class EpochBatches:
    """A process's share of the §5.1 batches of a tokenized corpus (training/tokens.py): every process builds the
    same list per epoch from the lengths alone; an optimizer step takes `accumulation` × processes consecutive
    batches, this process every num_processes-th of them, and reads only their rows. Pairs longer than
    `max_length` on either side are left out."""

    def __init__(self, train, max_length: int, max_tokens: int, seed: int, accumulation: int, rank: int, world: int):
        source, target = (train.data.column(f"{side}_length").to_numpy() for side in ("source", "target"))
        kept = np.flatnonzero((source <= max_length) & (target <= max_length)).astype(np.int32)
        self.pairs, self.skipped = len(kept), len(train) - len(kept)
        self.rows = kept if self.skipped else None  # the rows of the pairs batched (None: all)
        if self.skipped:
            source, target = source[kept], target[kept]
        self.lengths = source, target
        self.ids = [ChunkedRows(train.data.column(f"{side}_ids")) for side in ("source", "target")]
        self.max_tokens, self.seed = max_tokens, seed
        self.accumulation, self.rank, self.world = accumulation, rank, world
        self.epoch, self.batches = 0, token_batches(source, target, max_tokens, seed, 0)
        self.padding = padding_fraction(self.batches, source, target)
        self.steps_per_epoch = len(self.batches) // (accumulation * world)
        if self.pairs == 0:  # as the streamed reader says it
            raise ValueError(f"every training pair ({len(train):,}) is over --max_length {max_length} on a side: "
                             "raise --max_length")
        if self.steps_per_epoch == 0:
            left_out = f" ({self.skipped:,} of {len(train):,} pairs over --max_length {max_length} left out)" \
                if self.skipped else ""
            raise ValueError(f"the training data makes {len(self.batches)} batch(es) of at most {max_tokens} tokens"
                             f"{left_out}, fewer than the {accumulation * world} of one optimizer step: lower "
                             f"--tokens_per_step{' or raise --max_length' if self.skipped else ''}")

    def step(self, step: int) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
        """The source and target ids of this process's batches for optimizer step `step` (counted from 0)."""
        if self.epoch != step // self.steps_per_epoch:
            self.epoch = step // self.steps_per_epoch
            self.batches = token_batches(*self.lengths, self.max_tokens, self.seed, self.epoch)
        offset = (step % self.steps_per_epoch) * self.accumulation * self.world
        mine = [self.batches[offset + a * self.world + self.rank] for a in range(self.accumulation)]
        if self.rows is not None:
            mine = [self.rows[batch] for batch in mine]
        return [(self.ids[0][batch], self.ids[1][batch]) for batch in mine]


class ChunkedRows:
    """`rows[indices]`: the rows of an Arrow column of id lists (a `datasets` table's, memory-mapped or not) as numpy
    views of its memory, read straight from its chunks' offsets and values."""

    def __init__(self, column):
        self.offsets = [chunk.offsets.to_numpy() for chunk in column.chunks]
        self.values = [chunk.values.to_numpy() for chunk in column.chunks]
        self.starts = np.cumsum([0] + [len(chunk) for chunk in column.chunks])

    def __getitem__(self, indices: np.ndarray) -> list[np.ndarray]:
        chunks = np.searchsorted(self.starts, indices, side="right") - 1
        rows = []
        for chunk, row in zip(chunks.tolist(), (indices - self.starts[chunks]).tolist()):
            offsets = self.offsets[chunk]
            rows.append(self.values[chunk][offsets[row]: offsets[row + 1]])
        return rows


def encode(tokenizer, pairs):
    """Token ids of sources and targets (small sets: validation, test); both end with </s>."""
    return tokenizer([s for s, _ in pairs])["input_ids"], tokenizer(text_target=[t for _, t in pairs])["input_ids"]


def collate(indices, sources, targets, pad_id, device, multiple: int = 1):
    """Right-padded source ids and mask, and labels with -100 at padding (the model shifts them itself), each width
    rounded up to a multiple of `multiple` (few distinct shapes, for a compiled step). To a GPU the ids go from
    pinned memory, so the host does not wait for the copies (nor for the GPU's work before them)."""
    input_ids = padded([sources[i] for i in indices], pad_id, multiple)
    labels = padded([targets[i] for i in indices], -100, multiple)
    if torch.device(device).type == "cuda":
        input_ids, labels = (ids.pin_memory().to(device, non_blocking=True) for ids in (input_ids, labels))
    else:
        input_ids, labels = input_ids.to(device), labels.to(device)
    return {"input_ids": input_ids, "attention_mask": input_ids.ne(pad_id).long(), "labels": labels}


def padded(rows: list, value: int, multiple: int) -> torch.Tensor:
    """`rows` of ids (lists or arrays) as one (rows, width) tensor, filled out with `value`."""
    lengths = np.fromiter(map(len, rows), np.int64, len(rows))
    width = -(-int(lengths.max()) // multiple) * multiple
    ids = np.full((len(rows), width), value, np.int64)
    ids[np.arange(width) < lengths[:, None]] = np.concatenate(rows)  # row by row, as a boolean index orders them
    return torch.from_numpy(ids)
