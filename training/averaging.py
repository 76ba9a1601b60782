"""§6.1: "For the base models, we used a single model obtained by averaging the last 5 checkpoints, which were
written at 10-minute intervals. For the big models, we averaged the last 20 checkpoints."

The average streams: a float64 sum (the size of two float32 state dicts) and one tensor of one checkpoint at a
time, whatever the number of checkpoints.
"""

from pathlib import Path

import torch
from safetensors import safe_open

from training.checkpoints import WEIGHTS_FILE, checkpoints, verified
from vaswani_hf import VaswaniForConditionalGeneration


def average_checkpoints(weight_files: list[str | Path]) -> dict[str, torch.Tensor]:
    """The element-wise mean of the safetensors files, summed in float64 and returned in each tensor's own dtype
    (tensors that are not floating point are taken from the first file). Every file must hold the same names with
    the same shapes: otherwise a one-line ValueError names the file that does not fit."""
    if not weight_files:
        raise ValueError("average_checkpoints needs at least one checkpoint")
    first = Path(weight_files[0])
    with safe_open(str(first), framework="pt") as file:
        total = {key: file.get_tensor(key) for key in file.keys()}  # noqa: SIM118 (safe_open has no __iter__)
    dtypes = {key: tensor.dtype for key, tensor in total.items()}
    total = {key: tensor.to(torch.float64) if tensor.is_floating_point() else tensor for key, tensor in total.items()}
    for path in weight_files[1:]:
        with safe_open(str(path), framework="pt") as file:
            names = set(file.keys())
            if names != total.keys():
                difference = sorted(names ^ total.keys())
                raise ValueError(f"{path} does not fit {first}: it holds other weights ({', '.join(difference[:3])})")
            for key, summed in total.items():
                shape = tuple(file.get_slice(key).get_shape())
                if shape != tuple(summed.shape):
                    raise ValueError(
                        f"{path} does not fit {first}: {key} has shape {shape}, not {tuple(summed.shape)}"
                    )
                if summed.is_floating_point():
                    summed += file.get_tensor(key).to(torch.float64)
    return {key: (summed / len(weight_files)).to(dtypes[key]) if summed.is_floating_point() else summed
            for key, summed in total.items()}


def averaged_model(output_dir: Path, config, count: int, say) -> tuple[VaswaniForConditionalGeneration, list[Path]]:
    """The run's final model: the average of its last `count` intact checkpoints, and those checkpoints."""
    averaged = verified(checkpoints(output_dir), say, only=(WEIGHTS_FILE,))[-count:]
    if not averaged:
        raise SystemExit(f"error: every checkpoint in {output_dir} is damaged: nothing to average")
    final = VaswaniForConditionalGeneration(config)
    averaged_weights = average_checkpoints([p / WEIGHTS_FILE for p in averaged])
    missing, unexpected = final.load_state_dict(averaged_weights, strict=False)
    if unexpected or set(missing) - set(final.all_tied_weights_keys):  # only tied copies may be absent
        raise RuntimeError(f"averaged checkpoints do not fit the model: missing {missing}, unexpected {unexpected}")
    return final, averaged
