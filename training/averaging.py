"""§6.1: "For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were
written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."
"""

from pathlib import Path

import torch
from safetensors.torch import load_file


def average_state_dicts(state_dicts: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean, accumulated in float64 and returned in each tensor's own dtype."""
    if not state_dicts:
        raise ValueError("average_state_dicts needs at least one state dict")
    keys = state_dicts[0].keys()
    for other in state_dicts[1:]:
        if other.keys() != keys:
            raise ValueError(f"checkpoints hold different weights: {sorted(set(keys) ^ set(other.keys()))[:5]}")
    averaged = {}
    for key in keys:
        first = state_dicts[0][key]
        if not first.is_floating_point():
            averaged[key] = first.clone()
            continue
        total = sum(sd[key].to(torch.float64) for sd in state_dicts)
        averaged[key] = (total / len(state_dicts)).to(first.dtype)
    return averaged


def average_checkpoints(weight_files: list[str | Path]) -> dict[str, torch.Tensor]:
    """Average the safetensors weight files of several checkpoints."""
    return average_state_dicts([load_file(str(path)) for path in weight_files])
