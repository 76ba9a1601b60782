"""benchmarks/training_step.py: the steps it times are made of the batches training/run.py makes on a CPU, for every
preset (those without --max_tokens too), however few batches the data holds."""

import json
import math
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import training_step

from training import run

PRESETS = Path(run.__file__).parent / "presets"
PAIRS = 300


def pairs_of_random_lengths(seed: int = 0) -> tuple[list[list[int]], list[list[int]]]:
    """Source and target ids of PAIRS pairs, 2 to 59 tokens each side; pair i's tokens are i + 3, then </s>."""
    lengths = torch.randint(2, 60, (2, PAIRS), generator=torch.Generator().manual_seed(seed)).tolist()
    return tuple([[i + 3] * (length - 1) + [2] for i, length in enumerate(side)] for side in lengths)


@pytest.mark.parametrize("preset", sorted(path.stem for path in PRESETS.glob("*.json")))
def test_each_step_holds_the_batches_of_a_run_of_the_preset_on_a_cpu(preset):
    settings = json.loads((PRESETS / f"{preset}.json").read_text(encoding="utf-8"))
    cpu = SimpleNamespace(device=torch.device("cpu"))
    max_tokens = run.batch_tokens(cpu, None, None, SimpleNamespace(max_tokens=settings.get("max_tokens", 0)), 256)
    steps = training_step.step_batches(settings, pairs_of_random_lengths(), 0, steps=40)
    assert len(steps) == 40
    assert {len(step) for step in steps} == {math.ceil(settings["tokens_per_step"] / max_tokens)}  # as run.py counts
    batches = [batch for step in steps for batch in step]
    assert all(len(batch["labels"]) * max(batch["labels"].shape[1], batch["input_ids"].shape[1]) <= max_tokens
               for batch in batches)
    order = [i - 3 for batch in batches for i in batch["input_ids"][:, 0].tolist()]
    assert len(order) > PAIRS and sorted(order[:PAIRS]) == list(range(PAIRS))  # each pair once an epoch
    assert order[PAIRS:] == order[:len(order) - PAIRS]  # then the epoch again


@pytest.mark.parametrize("way", list(training_step.dropout_ways(0.3)))
def test_each_way_of_drawing_dropout_masks_drops_p_and_scales_what_it_keeps(way):
    torch.manual_seed(0)
    dropped = training_step.dropout_ways(0.3)[way](torch.ones(200, 500))
    kept = dropped != 0
    assert kept.float().mean().item() == pytest.approx(0.7, abs=0.005)  # 100,000 draws: a standard error of 0.0014
    assert torch.allclose(dropped[kept], torch.tensor(1 / 0.7))
