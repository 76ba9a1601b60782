# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""Linear layers that multiply by weights packed once for a decoding loop or train in oneDNN, and the machine facts
our CPU choices are kept under (`cpu_name`, `usable_cores`, `cache_root`, `writable`, `kept`, `kept_apart`).

A decoding loop multiplies the same weights by a few new rows at every step. oneDNN can multiply by a copy of a
weight reordered once into its blocked layout; a training step's products and their gradients can run in oneDNN as
well. Whether either is faster than torch's own kernel (MKL) end to end depends on the CPU and on the model's sizes,
so `fast_cpu` decides it by measuring whole calls (fast_cpu.py), never product by product.

* `PackedLinear`: `nn.Linear` whose float32 CPU products without gradient run in oneDNN against the packed weight
  while a packing block is open (`PACKING.block()`); with gradient, in oneDNN (`OneDNNLinear`) when its
  `onednn_training` is set (the plan's training choice); everywhere else (GPU, half precision, autocast,
  torch.compile and export) it computes as `nn.Linear`.
* `PACKING`: the open blocks and the packed copies. A copy is kept for the next block while its module stays in eval
  mode with the same weights; a module's forward in train mode, or the end of the outermost block for a module in
  train mode, frees it.

A model uses these only once `vaswani_hf.fast_cpu(model)` has transformed it; the model files, which travel to the
Hub, do not import this one.
"""

import contextlib
import hashlib
import json
import os
import platform
import tempfile
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from filelock import FileLock
from torch import nn
from transformers.utils import is_torchdynamo_compiling

# oneDNN's linear operator (the one torch.compile uses for CPU linear layers); absent from some torch builds.
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


def cpu_name() -> str:
    """The CPU's model name, family and model numbers as the kernel reports them (virtual machines often show only
    "AMD EPYC" or "Intel Xeon"): what speed choices are measured on."""
    cpuinfo = Path("/proc/cpuinfo")
    first = cpuinfo.read_text(encoding="utf-8").split("\n\n")[0].splitlines() if cpuinfo.exists() else []
    fields = {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in first if ":" in line)}
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    return name


def usable_cores() -> int:
    """The cores this process may run on, as joblib counts them: the fewest of the machine's, its affinity (Linux:
    `taskset`, a cluster job's cpuset) and a container's CPU limit (a cgroup quota: `docker run --cpus`,
    Kubernetes' limits), or LOKY_MAX_CPU_COUNT where set."""
    import joblib  # imported when asked (0.1 s), not with the package

    return joblib.cpu_count()


def cache_root(kind: str) -> Path:
    """Where what our tools make once per machine or model is kept: $VASWANI_HF_CACHE/`kind`, else
    ~/.cache/vaswani_hf/`kind`."""
    return Path(os.environ.get("VASWANI_HF_CACHE") or Path.home() / ".cache" / "vaswani_hf") / kind


class CacheNotWritable(OSError):
    """The cache folder cannot be written; the message names it and the way out, in one line."""


def writable(folder: Path) -> Path:
    """`folder`, made if missing, once a file could be written in it; else `CacheNotWritable`."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=folder, suffix=".partial"):
            pass
    except OSError as error:
        raise CacheNotWritable(f"vaswani_hf cannot write its cache {folder} ({error.strerror or error}): set "
                               f"VASWANI_HF_CACHE to a folder it can write") from None
    return folder


def kept(folder: Path, facts: dict, key: str, measure: Callable[[], dict]):
    """`key` of what `measure()` found under these facts (the CPU, versions, sizes: JSON values), kept in `folder` as
    a file named by them: measured the first time, and again if the file cannot be read; read back after."""
    return kept_apart(folder, {"": facts}, key, lambda missing: {"": measure()})[""]


def kept_apart(folder: Path, facts: dict[str, dict], key: str,
               measure: Callable[[list[str]], dict[str, dict]]) -> dict[str, object]:
    """By name, `key` of what was found under each name's facts, each kept in a file of its own named by them (so
    another call that lists a name with the same facts reads it back): those whose file is missing or cannot be read
    are measured together, `measure(names)` returning what was found by name, once `folder` is known to be writable
    (`writable`). One process measures at a time: another that needs the same waits, then reads what the first kept
    (runs started together take one plan, measured on a machine the others are not loading). Each file is written
    whole or not at all: a killed process leaves no half-written file."""
    paths = {name: folder / f"{hashlib.sha256(json.dumps(own, sort_keys=True).encode()).hexdigest()[:32]}.json"
             for name, own in facts.items()}
    found = readable(paths, key)
    if len(found) < len(facts):
        with FileLock(writable(folder) / "measuring.lock"):
            found = readable(paths, key)
            missing = [name for name in facts if name not in found]
            if missing:
                measured = measure(missing)
                for name in missing:
                    with tempfile.NamedTemporaryFile("w", encoding="utf-8", dir=folder, suffix=".partial",
                                                     delete=False) as file:
                        json.dump({**facts[name], **measured[name]}, file, indent=1)
                    os.replace(file.name, paths[name])
                    found[name] = measured[name][key]
    return {name: found[name] for name in facts}


def readable(paths: dict[str, Path], key: str) -> dict[str, object]:
    """By name, `key` of each file that can be read and holds it."""
    found = {}
    for name, path in paths.items():
        try:
            found[name] = json.loads(path.read_text(encoding="utf-8"))[key]
        except (OSError, ValueError, KeyError):
            pass
    return found


class Packing:
    """The packing blocks open in this process and the weights packed in them."""

    def __init__(self):
        # PackedLinear -> (weakref to the weight, its fingerprint, the block that last checked it, the packed weight):
        # valid while the module has that weight with the same fingerprint (`fingerprint`).
        self.packed: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()
        self.blocks = 0  # outermost blocks entered so far
        self.open = 0

    @contextlib.contextmanager
    def block(self) -> Iterator[None]:
        """A decoding loop: the weights cannot change inside it, so `PackedLinear` layers multiply by packed copies."""
        self.blocks += not self.open
        self.open += 1
        try:
            yield
        finally:
            self.open -= 1
            if not self.open:
                for module in [module for module in self.packed if module.training]:
                    del self.packed[module]

    def packed_weight(self, module: nn.Linear) -> torch.Tensor:
        """The module's weight reordered for oneDNN: the kept copy if its weight's fingerprint is unchanged, checked
        once per block; else a new copy."""
        weight, block = module.weight, self.blocks
        kept = self.packed.get(module)
        if kept is not None and kept[0]() is weight and kept[2] == block:
            return kept[3]  # checked already in this block: the hot path of every decoding step
        now = fingerprint(weight)
        if kept is not None and kept[0]() is weight and same(kept[1], now):
            self.packed[module] = (*kept[:2], block, kept[3])
            return kept[3]
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.packed[module] = (weakref.ref(weight), now, block, packed)
        return packed


def fingerprint(weight: torch.Tensor) -> tuple:
    """The version counter, the address and 64 values spread over the tensor. The values are needed: torch's fused
    Adam updates parameters in place without counting a version; it changes every value it updates, so a step
    that moved the weight and left all 64 values alone is not to be expected."""
    flat = weight.detach().reshape(-1)
    count = min(64, flat.numel())  # in integers: float32 steps overshoot the last index of 37000 x 512 values
    picks = torch.arange(count, device=flat.device) * (flat.numel() - 1) // max(count - 1, 1)
    return weight._version, weight.data_ptr(), flat[picks].clone()


def same(one: tuple, other: tuple) -> bool:
    return one[:2] == other[:2] and torch.equal(one[2], other[2])


PACKING = Packing()


def onednn_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b^T + bias in oneDNN; `b` dense (any strides) or a weight packed by `Packing.packed_weight`."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


def in_onednn(*tensors: torch.Tensor) -> bool:
    """Whether `PackedLinear` may compute with these tensors in oneDNN: float32 on the CPU with oneDNN present,
    outside autocast, torch.compile and export."""
    return (
        ONEDNN
        and all(tensor.is_cpu and tensor.dtype == torch.float32 for tensor in tensors)
        and not torch.is_autocast_enabled("cpu")
        and not is_torchdynamo_compiling()
    )


def with_gradient(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors)


class OneDNNLinear(torch.autograd.Function):
    """y = x W^T + b and its gradients, each of the three products in oneDNN. The weight's gradient G^T X is taken as
    (X^T G)^T where the layer widens (the output projection): oneDNN copies its first operand, transposed, into rows,
    and X is then the smaller (measured by shape: benchmarks/README.md, 2026-11-29)."""

    @staticmethod
    def forward(ctx, input: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(input, weight)
        return onednn_product(input, weight, bias)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        input, weight = ctx.saved_tensors
        grad_output = grad_output.reshape(-1, grad_output.shape[-1])  # (N, out)
        grad_input = grad_weight = grad_bias = None
        if ctx.needs_input_grad[0]:  # (N, out) @ (out, in)
            grad_input = onednn_product(grad_output, weight.t()).view(input.shape)
        if ctx.needs_input_grad[1]:  # (out, N) @ (N, in)
            rows = input.reshape(-1, input.shape[-1])  # (N, in)
            if weight.shape[0] > weight.shape[1]:  # oneDNN copies a transposed first operand: the smaller goes first
                grad_weight = onednn_product(rows.t(), grad_output.t()).t().contiguous()
            else:
                grad_weight = onednn_product(grad_output.t(), rows.t())
        if ctx.needs_input_grad[2]:  # (False without a bias)
            grad_bias = grad_output.sum(0)
        return grad_input, grad_weight, grad_bias


class PackedLinear(nn.Linear):
    """`nn.Linear` that multiplies by its weight packed for oneDNN inside a packing block, and with gradient computes
    in oneDNN where `onednn_training` is set (module docstring)."""

    onednn_training = False  # set by fast_cpu's plan

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not input.is_cpu:  # a GPU: torch's own layer, and no Python beyond this test on every call
            return super().forward(input)
        if self.training and PACKING.packed:
            PACKING.packed.pop(self, None)  # training changes the weights: a packed copy would go stale
        training = with_gradient(input, self.weight)
        if (self.onednn_training if training else PACKING.open) and in_onednn(input, self.weight):
            if training:
                return OneDNNLinear.apply(input, self.weight, self.bias)
            return onednn_product(input, PACKING.packed_weight(self), self.bias)
        return super().forward(input)
