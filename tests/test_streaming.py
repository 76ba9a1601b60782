"""--streaming (training/streaming.py): each process its own part of the stream, §5.1 batches over a bounded buffer,
and a resumed reader that goes on where it stopped."""

import itertools
import json
from collections import Counter

import pyarrow as pa
import pyarrow.compute as pc
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


def reader(shards: int, rank: int, world: int, buffer_pairs: int = 1000, seed: int = 5,
           encoder=None) -> StreamedBatches:
    return StreamedBatches(stream(shards), encoder or WordEncoder(TOKENIZER), rank, world, max_tokens=200,
                           max_length=MAX_LENGTH, buffer_pairs=buffer_pairs, seed=seed, accumulation=2)


def tokenized() -> list[tuple]:
    return [(tuple(s), tuple(t)) for s, t in zip(*(TOKENIZER(list(side))["input_ids"] for side in zip(*PAIRS)))]


def by_epoch(batches: StreamedBatches, epochs: int) -> list[list[tuple]]:
    """The batches of the process's first `epochs` passes over its part of the stream, each pair a tuple of ids,
    after checking each batch's size."""
    seen = [[] for _ in range(epochs)]
    for sources, targets, position in taken(batches, epochs):
        assert len(sources) * max(max(len(s), len(t)) for s, t in zip(sources, targets)) <= 200
        seen[position["epoch"]].append([(tuple(map(int, s)), tuple(map(int, t))) for s, t in zip(sources, targets)])
    return seen


def taken(batches: StreamedBatches, epochs: int = 1) -> list[tuple]:
    """The process's batches (sources, targets, position after the batch) until its epoch `epochs` begins. An epoch
    gives fewer batches than PAIRS has pairs: a reader that never ends one fails here instead of hanging the suite."""
    seen = []
    for _ in range(epochs * len(PAIRS) + 1):
        sources, targets = batches.next_batch()
        if batches.position()["epoch"] == epochs:
            return seen
        seen.append((sources, targets, batches.position()))
    raise AssertionError(f"{epochs} epochs gave more batches than {epochs} x {len(PAIRS)} pairs")


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


def test_a_stream_whose_pairs_are_all_longer_than_max_length_stops_with_one_line_after_one_epoch():
    """Every pair over --max_length: one epoch read (five buffers of 600) gives no batch, and every next would give
    none; the reader says so instead of reading the stream again forever. A few pairs short enough are batched."""
    from training.data import DataError

    batches = StreamedBatches(stream(1), WordEncoder(TOKENIZER), 0, 1, max_tokens=200, max_length=2,
                              buffer_pairs=600, seed=5, accumulation=1)
    set_epoch = batches.rows.set_epoch

    def at_most_twice(epoch):  # a reader that never stops fails here, not by hanging the suite
        assert epoch < 2, "the stream read a third time without a batch"
        set_epoch(epoch)

    batches.rows.set_epoch = at_most_twice
    with pytest.raises(DataError, match=r"^every training pair of this process's part of the stream is over "
                                        r"--max_length 2 on a side: raise --max_length$"):
        batches.next_batch()
    assert batches.start["epoch"] == 0  # stopped at the end of the first epoch
    shortest = min(max(len(s), len(t)) for s, t in tokenized())
    few = StreamedBatches(stream(1), WordEncoder(TOKENIZER), 0, 1, max_tokens=200, max_length=shortest,
                          buffer_pairs=600, seed=5, accumulation=1)
    assert all(max(len(s), len(t)) <= shortest for _ in range(3) for s, t in zip(*few.next_batch()))


def test_a_step_takes_the_accumulated_batches_in_turn_and_a_buffer_holds_whole_reads_of_pairs():
    """`step` gives `accumulation` batches, the next ones in turn. A buffer holds `buffer_pairs` pairs, rounded up
    to whole reads of 1,000 (fewer where the part ends): 50 pairs; 1,200 rounded up to 2,000, more than the 1,500
    pairs of a process's part of the stream."""
    first, second = reader(1, 0, 1), reader(1, 0, 1)
    assert [[list(map(list, side)) for side in batch] for batch in first.step(0)] == [
        [list(map(list, side)) for side in second.next_batch()] for _ in range(2)]
    kept = [max(len(s), len(t)) <= MAX_LENGTH for s, t in tokenized()]
    for world, buffer_pairs, part, step in ((1, 50, kept, 50), (2, 1200, kept[::2], 2000)):
        in_buffer = Counter()
        for sources, _, position in taken(reader(1, 0, world, buffer_pairs=buffer_pairs)):
            in_buffer[position["buffer"]] += len(sources)
        expected = [sum(part[i:i + step]) for i in range(0, len(part), step)]
        assert [in_buffer[buffer] for buffer in sorted(in_buffer)] == expected


def test_a_buffer_whose_pairs_are_all_too_long_is_passed_over():
    """Twenty pairs longer than --max_length, then ten short ones, in buffers of ten: the first batch is the short
    pairs', from the third buffer."""
    long, short = "the dog " * MAX_LENGTH, PAIRS[0]
    rows = Dataset.from_dict({"source": [long] * 20 + [short[0]] * 10, "target": [long] * 20 + [short[1]] * 10})
    batches = StreamedBatches(rows.to_iterable_dataset(), WordEncoder(TOKENIZER), 0, 1, max_tokens=200,
                              max_length=MAX_LENGTH, buffer_pairs=10, seed=5, accumulation=1)
    sources, _ = batches.next_batch()
    assert batches.position()["buffer"] == 2 and [list(s) for s in sources] == [TOKENIZER(short[0])["input_ids"]] * 10


def test_each_buffer_of_an_epoch_takes_its_batches_in_its_own_order():
    """Three buffers holding the same 100 pairs: batches of the same lengths in each, taken in three different orders
    (§5.1's batches shuffled per buffer, not one order repeated through the epoch)."""
    same = PAIRS[:100] * 3
    rows = Dataset.from_dict({"source": [s for s, _ in same], "target": [t for _, t in same]})
    batches = StreamedBatches(rows.to_iterable_dataset(), WordEncoder(TOKENIZER), 0, 1, max_tokens=200,
                              max_length=MAX_LENGTH, buffer_pairs=100, seed=5, accumulation=1)
    buffers = [[] for _ in range(3)]
    for sources, targets, position in taken(batches):
        buffers[position["buffer"]].append((len(sources), max(map(len, sources + targets))))
    assert len(buffers[0]) >= 6 and all(sorted(b) == sorted(buffers[0]) for b in buffers)
    assert len({tuple(b) for b in buffers}) == 3


def test_the_seed_decides_the_order_of_the_batches():
    """--seed: the same seed takes the batches in the same order; another seed takes the same pairs in another."""
    def first_epoch(seed):
        return [[list(map(int, s)) for s in sources] for sources, _, _ in taken(reader(1, 0, 1, seed=seed))]

    five, six = first_epoch(5), first_epoch(6)
    assert five == first_epoch(5) and five != six
    assert Counter(tuple(s) for batch in five for s in batch) == Counter(tuple(s) for batch in six for s in batch)


def test_ids_past_32767_reach_the_batches_as_encoded():
    """The paper's shared vocabulary holds about 37,000 tokens: the tokenizer's ids moved up by 36,700 come out of the
    stream as they went in."""
    words, shift = WordEncoder(TOKENIZER), 36_700

    class Shifted:
        def encode_column(self, column, target=False):
            ids = words.encode_column(column, target=target)
            return pa.ListArray.from_arrays(ids.offsets, pc.add(ids.values, pa.scalar(shift, pa.int32())))

    expected = Counter((tuple(i + shift for i in s), tuple(i + shift for i in t)) for s, t in tokenized()
                       if max(len(s), len(t)) <= MAX_LENGTH)
    assert pairs_of(by_epoch(reader(1, 0, 1, encoder=Shifted()), 1)[0]) == expected
