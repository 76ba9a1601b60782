"""How a run is spread over processes: one process, data parallel (DDP), or fully sharded (FSDP2).

Accelerate launches the processes and wraps the model for DDP. FSDP, asked for with `accelerate launch --use_fsdp
--fsdp_version 2` (or a config file), is applied here with torch's own `fully_shard`, on CPU and GPU alike:

- On CPU processes Accelerate 1.15 never turns FSDP on: `AcceleratorState` sets `DistributedType.FSDP` only for
  GPU-like devices (accelerate/state.py), so a CPU run asked to shard trained with plain DDP, without a word.
- Its FSDP2 wrapping (`fsdp2_prepare_model` in accelerate/utils/fsdp_utils.py) puts the input embedding and the
  output projection in one group and leaves the rest to the root. The paper shares one matrix among three modules
  (§3.4: both embeddings and the pre-softmax projection), so the decoder's embedding would see from the root a
  parameter the other group owns, which torch >= 2.13 refuses. (That grouping, rebuilt with fully_shard on this
  model: "ValueError: Parameter 'model.encoder.embed_tokens.weight' is shared with a parameter already managed by
  another FSDP group.")

So each encoder and decoder layer is one FSDP unit and the root unit holds everything else, the shared embedding
matrix with all three of its users. Accelerate still prepares the optimizer, the devices and mixed precision.
Checkpoints and evaluation gather full state dicts (`full_state_dict`), so a sharded run saves the same
`model.safetensors` as any other.

Mixed precision without FSDP: Accelerate runs the model's forward under autocast and converts what it returns to
float32. At the paper's batch that is a float32 copy of the 25,000 x 37,000 logits, whose gradient is float32 too,
each written and read again. The loss and the searches convert the logits they read themselves (training/loss.py,
vaswani_hf/gnmt.py; bfloat16 to float32 is exact), so `keep_output_dtype` keeps the autocast and drops the copy: the
same losses and gradients (a test), in less memory and fewer bytes moved (benchmarks/README.md, session 70).
"""

import os
from contextlib import contextmanager
from types import MethodType

import torch
from accelerate.utils.operations import ConvertOutputsToFp32
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor

from training.fsdp_request import fsdp_requested
from vaswani_hf.modeling_vaswani import VaswaniDecoderLayer, VaswaniEncoderLayer
from vaswani_hf.speed.kernels import usable_cores


def shard(model: torch.nn.Module, accelerator) -> torch.nn.Module:
    """fully_shard each encoder and decoder layer, then the root (module docstring); in place."""
    reshard = reshard_after_forward()
    low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(accelerator.mixed_precision)
    policy = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=torch.float32 if low else None)
    model.to(accelerator.device)
    for module in model.modules():
        if isinstance(module, VaswaniEncoderLayer | VaswaniDecoderLayer):
            fully_shard(module, reshard_after_forward=reshard, mp_policy=policy)
    fully_shard(model, reshard_after_forward=reshard, mp_policy=policy)
    return model


def prepare(accelerator, model, make_optimizer):
    """The model as this run trains it (sharded, DDP-wrapped or plain), and its optimizer and scheduler from
    `make_optimizer(model)`; under FSDP the optimizer is built over the sharded parameters."""
    if fsdp_requested():
        model = shard(model, accelerator)
        optimizer, scheduler = make_optimizer(model)
        return model, accelerator.prepare(optimizer), scheduler
    optimizer, scheduler = make_optimizer(model)
    model, optimizer = accelerator.prepare(model, optimizer)
    keep_output_dtype(model)
    return model, optimizer, scheduler


def keep_output_dtype(model) -> None:
    """The model's forward as Accelerate's mixed precision left it, autocast kept, without the conversion of its
    outputs to float32 (module docstring); in place, and nothing where there is none."""
    inner = unwrap(model)
    converting = getattr(inner.forward, "__wrapped__", None)
    if isinstance(converting, ConvertOutputsToFp32):
        forward = converting.model_forward  # the forward under autocast: unbound if Accelerate bound the conversion
        inner.forward = MethodType(forward, inner) if isinstance(inner.forward, MethodType) else forward


def describe(accelerator) -> dict:
    """How this run is spread over processes (after `check_fsdp_request`), for the log's first lines and
    metrics.json."""
    processes = accelerator.num_processes
    if fsdp_requested():
        return {"parallelism": "FSDP2", "processes": processes, "backend": _backend(),
                "sharding": "torch fully_shard, a unit per encoder and decoder layer and the root (with the shared "
                            f"embedding): parameters, gradients and Adam states split {processes} ways",
                "reshard_after_forward": reshard_after_forward()}
    if processes > 1:
        return {"parallelism": "DDP", "processes": processes, "backend": _backend(),
                "sharding": "none: every process holds the whole model"}
    return {"parallelism": "none", "processes": 1, "sharding": "none"}


def reshard_after_forward() -> bool:
    """Accelerate's FSDP_RESHARD_AFTER_FORWARD (default true): false keeps each unit's gathered parameters from the
    forward to the backward, in more memory and one gathering fewer."""
    return os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() != "false"


def share_cores(processes: int) -> None:
    """Each of `processes` CPU processes threads over its share of the cores this one may use. `accelerate launch`
    without GPUs sets OMP_NUM_THREADS=1 in every process, one alone included: a run would use one core."""
    torch.set_num_threads(max(1, usable_cores() // processes))


def held_parameters(model) -> int:
    """The parameters this process holds: its shards under FSDP, all of them otherwise."""
    return sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel() for p in model.parameters())


def _backend() -> str:
    return torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"


@contextmanager
def gradient_sync(accelerator, model, sync: bool):
    """Inside: backward passes whose gradients are reduced over the processes only if `sync` (the last batch
    of an optimizer step); the others accumulate locally."""
    if isinstance(model, FSDPModule):
        model.set_requires_gradient_sync(sync)
        yield
    elif sync:
        yield
    else:
        with accelerator.no_sync(model):
            yield


def clip_gradients(accelerator, model, max_norm: float) -> torch.Tensor:
    """Scale the step's gradients to a global L2 norm of at most `max_norm`, the norm taken over the whole model
    (every process's shard under FSDP); returns the norm before scaling, on the device (reading it would wait)."""
    norm = accelerator.clip_grad_norm_(model.parameters(), max_norm)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


def full_state_dict(model) -> dict[str, torch.Tensor]:
    """Every process calls this. The model's complete weights on the CPU, in the main process (the others get an
    empty dict), without the tied copies (§3.4: one matrix, saved once as transformers saves it)."""
    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    tied = getattr(unwrap(model), "all_tied_weights_keys", {}) or {}
    return {name: tensor for name, tensor in state.items() if name not in tied}


def unwrap(model):
    """The model inside a DDP wrapper (a sharded model is its own module)."""
    return model.module if isinstance(model, torch.nn.parallel.DistributedDataParallel) else model


def whole_model(accelerator, model, build):
    """Every process calls this. For evaluation in the main process: the model itself, or under FSDP a complete
    copy built by `build()` from the gathered weights (None in the other processes, which go on at once)."""
    if not isinstance(model, FSDPModule):
        return unwrap(model) if accelerator.is_main_process else None
    weights = full_state_dict(model)
    if not accelerator.is_main_process:
        return None
    with torch.random.fork_rng(devices=[]):  # building initializes weights: the run's dropout draws stay its own
        copy = build()
    copy.load_state_dict(weights, strict=False)  # (the tied copies, left out, are the built model's one matrix)
    return copy.to(accelerator.device).eval()
