"""Training pairs from datasets' streaming mode (`--streaming`): for a corpus larger than the disk cache should be,
read as training goes and never stored whole.

Each process reads its own part of the stream (`datasets.distributed.split_dataset_by_node`: its own shards, or every
N-th pair of N processes where the shards do not divide among them) and tokenizes it as it reads (training/tokens.py
`pair_encoder`). §5.1's token batching runs over a bounded buffer: `buffer_pairs` pairs are read, grouped by length
into batches of at most `max_tokens` tokens, and the batches taken in a random order; then the next buffer. An epoch
is one pass over the process's part; processes need not end theirs at the same step.

`position()` is where the process stands: the stream's state when its current buffer began (`state_dict()`), and the
batches of that buffer already taken. A resumed run reads that buffer again (the same pairs, the same batches, for the
same seed) and goes on after the batches taken: every pair is seen as in a run that never stopped.
"""

import numpy as np
from datasets import IterableDataset
from datasets.distributed import split_dataset_by_node

from training.batching import token_batches
from training.data import DataError
from training.tokens import encode_batch

READ = 1000  # pairs read and tokenized at a time (fewer if the buffer is smaller)


class StreamedBatches:
    def __init__(self, rows: IterableDataset, encoder, rank: int, world: int, max_tokens: int, max_length: int,
                 buffer_pairs: int, seed: int, accumulation: int):
        self.read = min(READ, buffer_pairs)
        self.reads = -(-buffer_pairs // self.read)  # whole reads: a buffer starts where a read starts
        self.rows = split_dataset_by_node(rows, rank, world).map(
            encode_batch, batched=True, batch_size=self.read, fn_kwargs={"encoder": encoder},
            remove_columns=["source", "target"])
        self.max_tokens, self.max_length, self.seed, self.accumulation = max_tokens, max_length, seed, accumulation
        self.start = {"epoch": 0, "buffer": 0, "stream": None}  # where the current buffer begins
        self.next, self.batches, self.reader = 0, None, None
        # Pairs kept (not over max_length) in the buffers of this epoch read so far. A resumed reader counts from its
        # buffer, which held batches: 0 at the end of an epoch still means an epoch without one.
        self.kept = 0

    def position(self) -> dict:
        """JSON: the stream's state where the current buffer began, and the number of its batches taken."""
        return {**self.start, "taken": self.next}

    def resume(self, position: dict) -> None:
        self.start, self.next = {key: position[key] for key in ("epoch", "buffer", "stream")}, position["taken"]

    def step(self, step: int) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
        """The source and target ids of this process's next `accumulation` batches (`step` is not needed: the
        stream's position is the process's own)."""
        return [self.next_batch() for _ in range(self.accumulation)]

    def next_batch(self) -> tuple[list[np.ndarray], list[np.ndarray]]:
        if self.batches is None:
            self._fill()
        while self.next == len(self.batches):  # (a buffer of pairs all too long has none)
            self.start = {**self.start, "buffer": self.start["buffer"] + 1, "stream": self.rows.state_dict()}
            self._fill()
            self.next = 0
        batch = self.batches[self.next]
        self.next += 1
        return [self.sources[i] for i in batch], [self.targets[i] for i in batch]

    def _fill(self) -> None:
        """Reads the buffer that begins at `self.start` (at the end of an epoch's part, the next epoch's first) and
        cuts it into batches."""
        while True:
            if self.reader is None:
                self.rows.set_epoch(self.start["epoch"])  # (a state loaded for another epoch is then ignored)
                if self.start["stream"] is not None:
                    self.rows.load_state_dict(self.start["stream"])
                self.reader = self.rows.iter(batch_size=self.read)
                self.kept = 0
            reads = [read for _, read in zip(range(self.reads), self.reader)]
            if reads:
                break
            if self.start["stream"] is None:
                raise DataError("the training stream holds no pairs for this process (fewer pairs than processes?)")
            if self.kept == 0:  # a whole epoch without a batch: so would every next one be
                raise DataError(f"every training pair of this process's part of the stream is over --max_length "
                                f"{self.max_length} on a side: raise --max_length")
            self.start, self.reader = {"epoch": self.start["epoch"] + 1, "buffer": 0, "stream": None}, None
        pairs = [(np.asarray(s, dtype=np.int32), np.asarray(t, dtype=np.int32)) for read in reads
                 for s, t in zip(read["source_ids"], read["target_ids"])]
        kept = [pair for pair in pairs if max(len(pair[0]), len(pair[1])) <= self.max_length]
        self.kept += len(kept)
        self.sources, self.targets = [s for s, _ in kept], [t for _, t in kept]
        self.batches = token_batches([len(s) for s in self.sources], [len(t) for t in self.targets], self.max_tokens,
                                     self.seed, self.start["epoch"] * 1_000_003 + self.start["buffer"])
