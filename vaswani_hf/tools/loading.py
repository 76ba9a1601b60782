"""Loading a model folder or Hub repository for the tools: one line for whatever makes it unusable, before its weights
are read, and the CPU transforms the tools apply."""

import contextlib
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, GenerationConfig
from transformers.utils import logging as hf_logging

from ..speed.fast_cpu import fast_cpu
from ..speed.kernels import CacheNotWritable
from ..speed.quantization import MISSING, DynamicLinear, quantize_int8

# What every tokenizer transformers saves writes one of: ours, tokenizers' JSON; a converted model's, its config.
TOKENIZER_ENTRIES = ("tokenizer.json", "tokenizer_config.json")
# The paper's decoding (§6.1): the beam and GNMT α the tools decode with where a model's generation config has none.
PAPERS_BEAMS, PAPERS_ALPHA = 4, 0.6


def load(name_or_path: str, device: str = "auto", int8: bool = False, fast: bool = True):
    """(model, tokenizer) from a model folder or Hub repository, in eval mode on `device` (with `int8`: the CPU
    model's int8 copy), on a CPU with `fast` transformed by `fast_cpu`; a missing or broken model, or another kind of
    model, exits with a one-line message before its weights are read."""
    if int8 and DynamicLinear is None:
        raise SystemExit(f"error: {MISSING}")
    if device == "auto":
        device = "cpu" if int8 or not torch.cuda.is_available() else "cuda"
    if int8 and device != "cpu":
        raise SystemExit(f"error: int8 runs on the CPU, not on {device}")
    kind = device_kind(device)
    accelerator = torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    if kind == "cuda":
        check_gpu(device, torch.cuda.device_count(), "torch")
    elif kind != "cpu" and kind != getattr(accelerator, "type", None):
        raise SystemExit(f"error: --device {device}: this machine has no {kind} device that torch can use")
    _, tokenizer = checked(name_or_path)
    model = loaded_whole(AutoModelForSeq2SeqLM, name_or_path)
    model = quantize_int8(model) if int8 else model.to(device).eval()
    if fast and kind == "cpu":
        try:
            fast_cpu(model, training=False)  # the tools decode: a plan for decoding alone
        except CacheNotWritable as error:
            raise SystemExit(f"error: {error}, or give --no_fast_cpu") from None
    return model, tokenizer


def loaded_whole(model_class, name_or_path: str, **kwargs):
    """`model_class.from_pretrained(name_or_path, **kwargs)`, where its weights are the whole model its config
    describes, tensor for tensor and shape for shape; else a one-line SystemExit naming the first misfit.
    transformers itself would only warn of a tensor missing or left over, drawing the missing one afresh, and would
    end a shape's misfit with "look at the above report" (its report and progress bar are not shown here)."""
    with one_line_errors(name_or_path), transformers_quiet():
        model, info = model_class.from_pretrained(name_or_path, output_loading_info=True,
                                                  ignore_mismatched_sizes=True, **kwargs)
    misfits = [*(f"{key} is missing" for key in sorted(info["missing_keys"])),
               *(f"{key} is {tuple(saved)}, the config makes it {tuple(built)}"
                 for key, saved, built in sorted(info["mismatched_keys"])),
               *(f"{key} is not part of the model" for key in sorted(info["unexpected_keys"]))]
    if misfits:
        more = f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else ""
        raise SystemExit(f"error: the weights of {name_or_path} do not fit its config: {misfits[0]}{more}")
    return model


@contextlib.contextmanager
def transformers_quiet():
    """Inside: transformers' warnings and progress bars off; after, as they were."""
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


def device_kind(device: str) -> str:
    try:
        return torch.device(device).type
    except RuntimeError:
        raise SystemExit(f"error: --device {device}: not a device (cpu, cuda, cuda:1, ...)") from None


def check_gpu(device: str, gpus: int, engine: str) -> None:
    """--device cuda or cuda:i where `engine` finds `gpus` CUDA GPUs: one that is not there exits with one line,
    before the engine's own failure (a traceback, or read as the model's)."""
    if (torch.device(device).index or 0) >= gpus:
        raise SystemExit(f"error: --device {device}: " + (f"{engine} can use cuda:0 to cuda:{gpus - 1} here" if gpus
                         else f"this machine has no CUDA GPU that {engine} can use"))


def refuse_blank_model(name_or_path: str) -> None:
    """A blank model argument is a one-line SystemExit: Path("") would be the current folder."""
    if not name_or_path.strip():
        raise SystemExit("error: the model is blank: give its folder or Hub id")


def is_local(name_or_path: str) -> bool:
    """Whether `name_or_path` means a folder here: a Hub id is "name" or "owner/name", and a path that exists, starts
    as a path does or whose parent folder exists here is not sent to the Hub."""
    path = Path(name_or_path)
    return path.exists() or name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") > 1 or (
        path.parent != Path(".") and path.parent.is_dir())


def checked(name_or_path: str):
    """(config, tokenizer) of a model folder or Hub repository, its weights not read: a missing or broken folder,
    another kind of model or a tokenizer without padding exits with one line. (transformers decodes without a
    generation_config.json it cannot read, greedily where the folder says beam search: that is refused too.)"""
    refuse_blank_model(name_or_path)
    if is_local(name_or_path) and not (Path(name_or_path) / "config.json").is_file():
        if (Path(name_or_path) / "trainer_state.json").is_file():  # run.py's checkpoints before they were models
            raise SystemExit(f"error: {name_or_path} is a checkpoint of a training run, not a model folder: the run "
                             "writes its model to the folder above when it ends (a stopped run: resume it with "
                             "--resume_from_checkpoint latest)")
        if newest := newest_checkpoint(Path(name_or_path)):
            raise SystemExit(f"error: {name_or_path} holds a training run whose model is not written yet (the run "
                             f"writes it when it ends): give its newest checkpoint, {newest}")
        raise SystemExit(f"error: {name_or_path} is not a model folder (no config.json there)")
    with one_line_errors(name_or_path):
        config = AutoConfig.from_pretrained(name_or_path)
        if config.model_type != "vaswani":
            how = f": convert it, vaswani-convert marian {name_or_path} OUT" if config.model_type == "marian" else ""
            raise SystemExit(f"error: {name_or_path} holds a {config.model_type!r} model, not a vaswani_hf one{how}")
        if is_local(name_or_path) and not any((Path(name_or_path) / name).is_file() for name in TOKENIZER_ENTRIES):
            raise SystemExit(f"error: {name_or_path} has no tokenizer (no {' or '.join(TOKENIZER_ENTRIES)} there): "
                             "save it beside the model, tokenizer.save_pretrained(folder)")  # transformers': 5 lines
        tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        if is_local(name_or_path) and (Path(name_or_path) / "generation_config.json").exists():
            GenerationConfig.from_pretrained(name_or_path)
    if tokenizer.pad_token_id is None:
        raise SystemExit(
            f"error: the tokenizer of {name_or_path} has no padding token (is tokenizer_config.json missing?)"
        )
    return config, tokenizer


def newest_checkpoint(folder: Path) -> Path | None:
    """The highest-numbered checkpoint-<step> model folder in a training run's `folder`, if any."""
    steps = [int(path.name.removeprefix("checkpoint-")) for path in folder.glob("checkpoint-*")
             if path.name.removeprefix("checkpoint-").isdigit() and (path / "config.json").is_file()]
    return folder / f"checkpoint-{max(steps)}" if steps else None


@contextlib.contextmanager
def one_line_errors(name_or_path: str):
    """Inside: what an unusable folder raises (OSError, ValueError, KeyError, ...) exits with its first line."""
    try:
        yield
    except CacheNotWritable as error:  # not the folder's fault
        raise SystemExit(f"error: {error}") from None
    except Exception as error:  # noqa: BLE001 - unusable folders raise OSError, ValueError, KeyError, ...
        raise SystemExit(f"error: cannot load a model from {name_or_path}: {first_line(error)}") from None


def first_line(error: BaseException) -> str:
    """What a one-line error says of `error`: its message's first line, or its type's name when it has none."""
    message = str(error).strip()
    return message.splitlines()[0] if message else type(error).__name__


def learned_positions(config) -> int | None:
    """How many learned positions the model has (Table 3, row E), None for the sinusoids of any length."""
    return config.max_position_embeddings if config.position_embedding == "learned" else None


def papers_decoding(generation) -> bool:
    """Whether a generation config asks for the paper's search: it names `gnmt_alpha` (training/run.py's), or it is
    none of the model's own (made from its config); else it is the decoding a converted model was published with."""
    return getattr(generation, "gnmt_alpha", None) is not None or generation._from_model_config
