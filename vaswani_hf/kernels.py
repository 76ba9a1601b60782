# Copyright 2026 The vaswani_hf authors. Licensed under the Apache License, Version 2.0.
"""CPU kernels chosen by measurement on the machine that runs them.

The model's time goes to matrix products (its linear layers) and, when decoding, to many small attention products.
Which kernel computes them fastest depends on the CPU: on an AMD EPYC (Zen 5) oneDNN ran float32 products 1.2-4x as
fast as MKL, torch's BLAS, and on an Intel Xeon at 0.74-2x of it (`benchmarks/matmul.py`, README). So nothing
here is tuned to one machine: the first time a product of a shape class is met, each candidate kernel is timed on it
briefly and the fastest is kept for the rest of the process, as cuDNN's benchmark mode does on GPUs.

* `VaswaniLinear`: `nn.Linear` whose float32 CPU products without gradient choose among torch's own (`F.linear`,
  MKL), oneDNN, and — inside a decoding block (`decoding()`, entered by `generate()` and vaswani-translate's search)
  — oneDNN with the weight reordered once into its blocked layout. Shape classes: the kind of product (inference,
  or inside a decoding block), the weight's shape, and the number of tokens (input rows) rounded up to a power of
  two. Products with gradient (training) are torch's own, never chosen by timing: kernels round differently, and a
  choice that depended on how busy the machine was would make the same run give other weights.
* `measured_attention(eager)`: transformers' SDPA kernel, except without gradient on the CPU (encoding and decoding
  steps), where SDPA or the eager product is chosen the same way: torch's CPU SDPA has a fixed cost per call that
  a decoding step's few query rows may not repay. `fast_cpu` registers it as an attention kernel of its own name,
  `attn_implementation="vaswani_measured"`; transformers' default, "sdpa", and "eager" run those kernels and
  nothing else.

What was chosen, the packed weights and the forced kernels live in one object, `KERNELS`. The environment variable
`VASWANI_KERNELS` (read at import; comma-separated names from `KERNEL_NAMES`), or `KERNELS.force(...)`, forces
kernels by name, for debugging and benchmarks: a forced name is taken wherever it is a candidate. Everywhere else
(GPU, half precision, autocast, torch.compile and export) the layers are `nn.Linear` and the attention is SDPA.

A model uses these only once `vaswani_hf.fast_cpu(model)` has transformed it (fast_cpu.py); the model files, which
travel to the Hub, do not import this one.
"""

import contextlib
import math
import os
import platform
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
from torch import nn
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.utils import is_torchdynamo_compiling

# oneDNN's linear operator (the one torch.compile uses for CPU linear layers); absent from some torch builds.
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")

MEASURED_ATTENTION = "vaswani_measured"  # the name `fast_cpu` registers `measured_attention` under
LINEAR_KERNELS = ("torch", "onednn", "onednn_packed")
ATTENTION_KERNELS = ("eager", "sdpa")
KERNEL_NAMES = LINEAR_KERNELS + ATTENTION_KERNELS


def parse_kernel_names(text: str) -> tuple[str, ...]:
    names = tuple(name.strip() for name in text.split(",") if name.strip())
    unknown = [name for name in names if name not in KERNEL_NAMES]
    if unknown:
        raise ValueError(f"unknown kernel {unknown[0]!r} (VASWANI_KERNELS): choose among {', '.join(KERNEL_NAMES)}")
    return names


def cpu_name() -> str:
    """The CPU's model name, family and model numbers as the kernel reports them (virtual machines often show only
    "AMD EPYC" or "Intel Xeon"): what kernel choices are measured on."""
    cpuinfo = Path("/proc/cpuinfo")
    first = cpuinfo.read_text().split("\n\n")[0].splitlines() if cpuinfo.exists() else []
    fields = {key.strip(): value.strip() for key, value in (line.split(":", 1) for line in first if ":" in line)}
    name = fields.get("model name") or platform.processor() or "unknown CPU"
    if "cpu family" in fields:
        name += f" (family {fields['cpu family']}, model {fields.get('model', '?')})"
    return name


def fastest(names: tuple[str, ...], run: Callable[[str], object], min_seconds: float = 2e-3,
            max_rounds: int = 25) -> str:
    """The candidate whose best time is least: one warm-up call each (oneDNN creates its primitives, a weight is
    packed), then rounds of one call each, interleaved, until every candidate has had 2 rounds and `min_seconds`."""
    for name in names:
        run(name)
    best = dict.fromkeys(names, math.inf)
    spent = dict.fromkeys(names, 0.0)
    for round_ in range(max_rounds):
        for name in names:
            start = time.perf_counter()
            run(name)
            elapsed = time.perf_counter() - start
            best[name] = min(best[name], elapsed)
            spent[name] += elapsed
        if round_ >= 1 and min(spent.values()) >= min_seconds:
            break
    return min(names, key=best.__getitem__)


class Kernels:
    """The kernel state of the process: choices made by measurement, kernels forced by name, and the weights packed
    for decoding."""

    def __init__(self, forced: str = ""):
        self.forced = parse_kernel_names(forced)
        self.chosen: dict[tuple, str] = {}
        # VaswaniLinear -> (weakref to the weight, its fingerprint, the decoding loop that last checked it, the packed
        # weight): valid while the module has that weight with the same fingerprint (`fingerprint`).
        self.packed: weakref.WeakKeyDictionary[nn.Module, tuple] = weakref.WeakKeyDictionary()
        self.decoding_loops = 0  # outermost decoding blocks entered so far
        self.open_decoding_blocks = 0
        self.frozen = False

    def force(self, *names: str) -> None:
        """Take these kernels wherever they are candidates (the first that is); none: choose by measurement."""
        self.forced = parse_kernel_names(",".join(names))

    def choose(self, key: tuple, names: tuple[str, ...], run: Callable[[str], object]) -> str:
        """The kernel for this shape class: forced, chosen before, or measured now by running each of `names`."""
        for name in self.forced:
            if name in names:
                return name
        choice = self.chosen.get(key)
        if choice is None:
            choice = self.chosen[key] = (self.frozen and self.nearest(key, names)) or fastest(names, run)
        return choice

    def nearest(self, key: tuple, names: tuple[str, ...]) -> str | None:
        """The choice of the class closest in size (key[1]) among those that differ from `key` in nothing else."""
        found = [(abs(other[1] - key[1]), other[1], name) for other, name in self.chosen.items()
                 if other[0] == key[0] and other[2:] == key[2:] and name in names]
        return min(found)[2] if found else None

    def freeze(self) -> None:
        """From now on a shape class met for the first time takes the choice of its nearest measured neighbour
        (`nearest`) instead of a new measurement, if it has one. A training run keeps its choices in its checkpoints
        and freezes them when resumed: it decodes (validation) with the kernels it would have used."""
        self.frozen = True

    def state_dict(self) -> dict:
        """The choices, as JSON: `{"cpu": cpu_name(), "chosen": [[key, kernel], ...]}`."""
        return {"cpu": cpu_name(), "chosen": [[list(key), name] for key, name in self.chosen.items()]}

    def load_state_dict(self, state: dict) -> bool:
        """Takes the choices of `state_dict()` if they were measured on a CPU of this name; returns whether so."""
        if state.get("cpu") != cpu_name():
            return False
        self.chosen = {tuple(tuple(part) if isinstance(part, list) else part for part in key): name
                       for key, name in state["chosen"]}
        return True

    def summary(self) -> dict[str, dict[str, int]]:
        """How many shape classes of each kind chose each kernel, e.g. {"forward": {"onednn": 12}}."""
        counts: dict[str, dict[str, int]] = {}
        for key, name in self.chosen.items():
            kind = counts.setdefault(key[0], {})
            kind[name] = kind.get(name, 0) + 1
        return counts

    @contextlib.contextmanager
    def decoding(self) -> Iterator[None]:
        """A decoding loop: the weights cannot change inside it, so a linear layer may multiply by a copy of its
        weight reordered once into oneDNN's blocked layout (made when a shape class first chooses it). The copies
        are kept for the next loop while their module stays in eval mode with the same weights; a module's forward
        in train mode, or the end of the outermost block for a module in train mode, frees its copy."""
        self.decoding_loops += not self.open_decoding_blocks
        self.open_decoding_blocks += 1
        try:
            yield
        finally:
            self.open_decoding_blocks -= 1
            if not self.open_decoding_blocks:
                for module in [module for module in self.packed if module.training]:
                    del self.packed[module]

    def packed_weight(self, module: nn.Linear) -> torch.Tensor:
        """The module's weight reordered for oneDNN: the kept copy if its weight's fingerprint is unchanged, checked
        once per decoding loop; else a new copy."""
        weight, loop = module.weight, self.decoding_loops
        kept = self.packed.get(module)
        if kept is not None and kept[0]() is weight and kept[2] == loop:
            return kept[3]  # checked already in this loop: the hot path of every decoding step
        now = fingerprint(weight)
        if kept is not None and kept[0]() is weight and same(kept[1], now):
            self.packed[module] = (*kept[:2], loop, kept[3])
            return kept[3]
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
        self.packed[module] = (weakref.ref(weight), now, loop, packed)
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


KERNELS = Kernels(os.environ.get("VASWANI_KERNELS", ""))


def onednn_product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b^T + bias in oneDNN; `b` dense (any strides) or a weight packed by `Kernels.packed_weight`."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


def product(name: str, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """a @ b^T + bias with the kernel `name` ("onednn_packed": `b` is the packed weight)."""
    return nn.functional.linear(a, b, bias) if name == "torch" else onednn_product(a, b, bias)


def measured_product(kind: str, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                     packed: Callable[[], torch.Tensor] | None = None) -> torch.Tensor:
    """a @ b^T + bias with the kernel chosen for this kind of product, the weight's shape and the number of tokens
    (input rows, rounded up to a power of two). `packed` offers the packed weight as a candidate."""
    names = LINEAR_KERNELS[:2] + (("onednn_packed",) if packed is not None else ())

    def run(name: str) -> torch.Tensor:
        return product(name, a, packed() if name == "onednn_packed" else b, bias)

    tokens = a.numel() // a.shape[-1]
    return run(KERNELS.choose((kind, tokens.bit_length(), tuple(b.shape), bias is not None), names, run))


def measured_products_apply(*tensors: torch.Tensor) -> bool:
    """Whether `VaswaniLinear` chooses kernels for these tensors: float32 on the CPU with oneDNN present, without
    gradient, outside autocast, torch.compile and export."""
    return (
        ONEDNN
        and all(tensor.is_cpu and tensor.dtype == torch.float32 for tensor in tensors)
        and not (torch.is_grad_enabled() and any(tensor.requires_grad for tensor in tensors))
        and not torch.is_autocast_enabled("cpu")
        and not is_torchdynamo_compiling()
    )


class VaswaniLinear(nn.Linear):
    """`nn.Linear` whose float32 CPU products without gradient run in the kernel measured fastest for their shape on
    this machine; with gradient (training), torch's own."""

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if not input.is_cpu:  # a GPU: torch's own layer, and no Python beyond this test on every call
            return super().forward(input)
        if self.training and KERNELS.packed:
            KERNELS.packed.pop(self, None)  # training changes the weights: a packed copy would go stale
        if not measured_products_apply(input, self.weight):
            return super().forward(input)
        if KERNELS.open_decoding_blocks:
            return measured_product("decoding", input, self.weight, self.bias, lambda: KERNELS.packed_weight(self))
        return measured_product("inference", input, self.weight, self.bias)


def measured_attention(eager: Callable) -> Callable:
    """An attention kernel for transformers' interface: SDPA, except without gradient on the CPU, where the faster of
    SDPA and `eager` is chosen per shape class (batch x heads, query rows and keys rounded to powers of two). Where
    the mask does not say what the query rows see — SDPA's implicit causal mask for several rows — SDPA runs. It
    returns no attention weights, as SDPA does."""
    kernels = {"eager": eager, "sdpa": sdpa_attention_forward}

    def measured_attention_forward(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                   attention_mask: torch.Tensor | None, **kwargs) -> tuple[torch.Tensor, None]:
        def run(name: str) -> torch.Tensor:
            return kernels[name](module, query, key, value, attention_mask, **kwargs)[0]

        if (
            query.device.type != "cpu"
            or torch.is_grad_enabled()
            or is_torchdynamo_compiling()
            or (attention_mask is None and module.is_causal and query.shape[2] > 1)
        ):
            return run("sdpa"), None
        batch, heads, rows, d_k = query.shape  # (B, h, T, d_k)
        shape_class = ("attention", batch.bit_length(), heads, rows.bit_length(), key.shape[2].bit_length(), d_k,
                       attention_mask is None)
        return run(KERNELS.choose(shape_class, ATTENTION_KERNELS, run)), None

    return measured_attention_forward
