"""--streaming (training/streaming.py): each process its own part of the stream, §5.1 batches over a bounded buffer,
and a resumed reader that goes on where it stopped."""

import itertools
import json
from collections import Counter

import pytest
from datasets import Dataset

from training.default_data import generate
from training.streaming import StreamedBatches
from training.tokenizer import train_joint_bpe
from training.tokens import WordEncoder

PAIRS = generate()["train"][:3000]
TOKENIZER = train_joint_bpe((side for pair in PAIRS for side in pair), 300)
MAX_LENGTH = 20  # a few pairs are longer, and left out


def stream(shards: int):
    rows = Dataset.from_dict({"source": [s for s, _ in PAIRS], "target": [t for _, t in PAIRS]})
    return rows.to_iterable_dataset(num_shards=shards)


def reader(shards: int, rank: int, world: int, buffer_pairs: int = 1000) -> StreamedBatches:
    return StreamedBatches(stream(shards), WordEncoder(TOKENIZER), rank, world, max_tokens=200,
                           max_length=MAX_LENGTH, buffer_pairs=buffer_pairs, seed=5, accumulation=2)


def tokenized() -> list[tuple]:
    return [(tuple(s), tuple(t)) for s, t in zip(*(TOKENIZER(list(side))["input_ids"] for side in zip(*PAIRS)))]


def by_epoch(batches: StreamedBatches, epochs: int) -> list[list[tuple]]:
    """The batches of the process's first `epochs` passes over its part of the stream, each pair a tuple of ids,
    after checking each batch's size."""
    seen = [[] for _ in range(epochs)]
    while True:
        sources, targets = batches.next_batch()
        epoch = batches.position()["epoch"]
        if epoch == epochs:
            return seen
        assert len(sources) * max(max(len(s), len(t)) for s, t in zip(sources, targets)) <= 200
        seen[epoch].append([(tuple(map(int, s)), tuple(map(int, t))) for s, t in zip(sources, targets)])


def pairs_of(batches: list[list[tuple]]) -> Counter:
    return Counter(pair for batch in batches for pair in batch)


@pytest.mark.parametrize("shards", [4, 1])  # its own shards; or every other pair of a stream of one shard
def test_two_processes_read_disjoint_parts_that_make_up_the_whole_stream(shards):
    everything = tokenized()
    kept = Counter(pair for pair in everything if max(len(pair[0]), len(pair[1])) <= MAX_LENGTH)
    assert 0 < len(everything) - sum(kept.values()) < 300
    parts = [pairs_of(by_epoch(reader(shards, rank, 2), 1)[0]) for rank in (0, 1)]
    assert parts[0] + parts[1] == kept  # every pair once, in one process or the other
    assert abs(parts[0].total() - parts[1].total()) <= kept.total() // 10
    assert pairs_of(by_epoch(reader(shards, 0, 1), 1)[0]) == kept  # one process reads all of it


def test_a_resumed_reader_goes_on_with_the_batches_of_one_that_never_stopped():
    """Positions taken at every batch, into and across buffers (1,000 pairs) and epochs (1,500 pairs a process),
    JSON and back, as a checkpoint holds them."""
    first = reader(4, 1, 2)
    positions, batches = [], []
    for _ in range(260):
        positions.append(json.loads(json.dumps(first.position())))
        batches.append(first.next_batch())
    assert {p["epoch"] for p in positions} == {0, 1, 2} and {p["buffer"] for p in positions} == {0, 1}
    for k in (0, 1, 37, *(i for i in range(1, 260) if positions[i]["buffer"] != positions[i - 1]["buffer"])):
        resumed = reader(4, 1, 2)
        resumed.resume(positions[k])
        for expected in batches[k:k + 60]:  # on into the next epoch
            assert [list(map(list, side)) for side in resumed.next_batch()] == [list(map(list, side))
                                                                                 for side in expected]


def test_batches_are_grouped_by_length_within_the_buffer_and_differ_by_epoch():
    first, second = by_epoch(reader(1, 0, 1, buffer_pairs=3000), 2)
    assert pairs_of(first) == pairs_of(second) and first != second

    def padding(batches):
        longest = [max(max(len(s), len(t)) for s, t in batch) for batch in batches]
        return 1 - sum(max(len(s), len(t)) for batch in batches for s, t in batch) / sum(
            len(batch) * n for batch, n in zip(batches, longest))

    pairs = [pair for pair in tokenized() if max(len(pair[0]), len(pair[1])) <= MAX_LENGTH]  # in the stream's order
    in_stream_order = [pairs[i:i + len(batch)] for i, batch in zip(
        itertools.accumulate((len(b) for b in first), initial=0), first)]
    assert padding(first) < 0.05 < padding(in_stream_order)


def test_a_process_whose_part_of_the_stream_is_empty_stops_with_one_line():
    """One pair and two processes: the second reads nothing, and says why instead of waiting for pairs forever."""
    from training.data import DataError

    one = Dataset.from_dict({"source": [PAIRS[0][0]], "target": [PAIRS[0][1]]}).to_iterable_dataset()
    batches = StreamedBatches(one, WordEncoder(TOKENIZER), 1, 2, max_tokens=200, max_length=MAX_LENGTH,
                              buffer_pairs=10, seed=5, accumulation=1)
    with pytest.raises(DataError, match=r"^the training stream holds no pairs for this process \(fewer pairs than "):
        batches.next_batch()
