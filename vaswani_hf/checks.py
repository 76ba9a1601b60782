# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""One-line errors for inputs that would otherwise end in a stack trace deep inside torch.

This file travels to the Hub beside modeling_vaswani.py: it imports only torch and transformers.
"""

import torch
from transformers.utils import is_torchdynamo_compiling


def check_token_ids(ids: torch.Tensor, vocab_size: int, name: str, values: bool = True) -> None:
    """One-line errors for token ids that an embedding lookup would turn into a stack trace. The shape and dtype
    are checked always; the values (`values=True`) by reading their least and greatest to the host, which on a GPU
    waits for the device: done where a sequence begins, not at every decoding step."""
    if ids.dim() != 2:
        raise ValueError(f"{name} must have shape (batch, length), got shape {tuple(ids.shape)}")
    if ids.shape[0] == 0 or ids.shape[1] == 0:
        raise ValueError(f"{name} is empty (shape {tuple(ids.shape)}): give at least one token per sequence")
    if ids.dtype.is_floating_point:
        raise ValueError(f"{name} must hold integer token ids, got dtype {ids.dtype}")
    if values and not is_torchdynamo_compiling():
        low, high = (int(value) for value in torch.stack(torch.aminmax(ids)).tolist())  # one wait, not two
        if low < 0 or high >= vocab_size:
            raise ValueError(
                f"{name} must be token ids in [0, {vocab_size}), got values from {low} to {high}"
                + (" (-100 marks ignored labels: pass it as labels, not as inputs)" if low == -100 else "")
            )


def check_mask(mask: torch.Tensor | None, batch_size: int, length: int, name: str, for_name: str) -> None:
    """A 2D padding mask must be (batch, length) of the sequence it masks; 4D masks are taken as built."""
    if mask is not None and mask.dim() != 4 and tuple(mask.shape) != (batch_size, length):
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but {for_name} needs ({batch_size}, {length}): "
            "one entry per token, 1 for tokens and 0 for padding"
        )
