"""The flags of training/run.py: data, model and recipe, with presets (training/presets/NAME.json) as defaults
that any flag overrides, and every value checked before any work starts."""

import difflib
import json
import math
import os
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch
from transformers import HfArgumentParser

from training.fsdp_request import launcher_backend
from vaswani_hf import VaswaniConfig
from vaswani_hf.speed.kernels import CacheNotWritable, cache_root, writable
from vaswani_hf.tools.hub import check_can_push
from vaswani_hf.tools.loading import first_line

PRESETS = Path(__file__).resolve().parent / "presets"


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESETS.glob("*.json"))


@dataclass
class DataArguments:
    dataset_name: str | None = field(default=None, metadata={
        "help": "A Hub dataset, or a local folder datasets.load_dataset reads (CSV files, save_to_disk's): a "
                "translation column or a column per language."})
    dataset_config_name: str | None = field(default=None, metadata={"help": "Its configuration, e.g. de-en."})
    train_file: str | None = field(default=None, metadata={
        "help": "JSON lines (.json, .jsonl), or a prefix of aligned PREFIX.<lang> files; either .gz, .bz2 or .xz "
                "compressed too."})
    validation_file: str | None = field(default=None, metadata={"help": "As train_file."})
    test_file: str | None = field(default=None, metadata={"help": "As train_file."})
    source_lang: str = field(default="en")
    target_lang: str = field(default="de")
    max_length: int = field(default=256, metadata={"help": "Training pairs longer than this (in tokens) are skipped."})
    bpe_sample: int | None = field(default=None, metadata={
        "help": "Train the joint BPE on this many training pairs drawn at random (default: all of them; for a corpus "
                "of millions of pairs, where every sentence would take long)."})
    streaming: bool = field(default=False, metadata={
        "help": "Read the training pairs as training goes (datasets' streaming mode), never downloaded or tokenized "
                "whole: for a corpus larger than the disk should hold. Needs --bpe_sample (the BPE learns from the "
                "stream's first pairs); each process reads its own shards (training/streaming.py)."})
    shuffle_buffer: int = field(default=100_000, metadata={
        "help": "With --streaming: pairs read at a time and grouped into token batches (§5.1) in random order."})
    card_dataset: str | None = field(default=None, metadata={
        "help": "The data's Hub dataset id, for the model card's metadata (default: --dataset_name unless a local "
                "folder; none for files)."})
    card_license: str | None = field(default=None, metadata={
        "help": "The license the model card declares, e.g. cc-by-4.0 (default: none claimed, except for the "
                "embedded data, apache-2.0)."})


# The model flags that are the recipe's too (§5.4, Regularization): a fine-tuning run may set them over its start's.
DROPOUTS = ("dropout", "attention_dropout", "activation_dropout")


@dataclass
class ModelArguments:
    vocab_size: int = field(default=37000, metadata={"help": "Size of the joint BPE vocabulary (§5.1)."})
    d_model: int = 512
    d_ff: int = 2048
    num_heads: int = 8
    d_k: int | None = field(default=None, metadata={
        "help": "Each head's query and key width (Table 3 row B: 16, 32; default: d_model / num_heads)."})
    d_v: int | None = field(default=None, metadata={"help": "Each head's value width (default: d_model / num_heads)."})
    num_layers: int = field(default=6, metadata={"help": "N (§3.1): encoder layers, and decoder layers unless given."})
    num_decoder_layers: int | None = field(default=None, metadata={"help": "Decoder layers (default: --num_layers)."})
    dropout: float = field(default=0.1, metadata={"help": "P_drop (§5.4)."})
    attention_dropout: float = field(default=0.0, metadata={"help": "On the attention weights: not the paper's."})
    activation_dropout: float = field(default=0.0, metadata={"help": "After the feed-forward ReLU: not the paper's."})
    position_embedding: str = "sinusoidal"
    normalize_before: bool = field(default=False, metadata={"help": "Pre-LN: a deviation from the paper."})

    def config(self, tokenizer) -> VaswaniConfig:
        """The model's configuration, with the vocabulary and special tokens of the trained `tokenizer`."""
        return VaswaniConfig(
            vocab_size=len(tokenizer), d_model=self.d_model, d_ff=self.d_ff, num_heads=self.num_heads,
            d_k=self.d_k, d_v=self.d_v, num_layers=self.num_layers, num_decoder_layers=self.num_decoder_layers,
            **self.dropouts(),
            position_embedding=self.position_embedding, normalize_before=self.normalize_before,
            pad_token_id=tokenizer.pad_token_id, bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id, decoder_start_token_id=tokenizer.bos_token_id,
        )

    def planned_config(self) -> VaswaniConfig:
        """The configuration before the BPE is trained: --vocab_size tokens, training/tokenizer.py's special ids."""
        return self.config(_StandInTokenizer(self.vocab_size))

    def dropouts(self) -> dict[str, float]:
        """The dropout probabilities given (with --model_name_or_path, those not given are None: the start's)."""
        return {name: getattr(self, name) for name in DROPOUTS if getattr(self, name) is not None}


@dataclass
class RecipeArguments:
    preset: str | None = field(default=None, metadata={
        "help": f"A recipe file in training/presets: {preset_names()}."})
    output_dir: str = field(default="outputs/run")
    seed: int = 1
    max_steps: int = field(default=100000, metadata={"help": "Optimizer steps (§5.2: 100k for base)."})
    max_train_minutes: float | None = field(default=None, metadata={
        "help": "A wall-clock budget of training, validations not counted: stop after it, and fit the schedule, "
                "checkpoints and evaluations to the steps the machine is measured to make in it (training/budget.py; "
                "not the paper's)."})
    warmup_share: float = field(default=0.04, metadata={
        "help": "With a budget: warmup over this share of the expected steps (paper: 4k of 100k)."})
    cooldown_share: float = field(default=0.0, metadata={
        "help": "With a budget: a linear decay to zero over this last share of the expected steps."})
    average_share: float = field(default=0.1, metadata={
        "help": "With a budget and no --save_steps/--save_minutes: the averaged checkpoints span its last share."})
    replay_schedule: str | None = field(default=None, metadata={
        "help": "A budgeted run's schedule.json: with the same flags, follow it instead of the clock, to the same "
                "weights (training/budget.py)."})
    evaluations: int = field(default=0, metadata={
        "help": "With a budget: validation this many times, evenly spaced inside it (instead of --eval_steps)."})
    dropout_epochs: list[float] | None = field(default=None, metadata={
        "help": "E0 E1: fit P_drop to the epochs the run is expected to make (with a budget as measured, else by "
                "--max_steps): none up to E0, rising linearly to --dropout at E1 (training/budget.py; not the "
                "paper's)."})
    max_tokens: int = field(default=0, metadata={
        "help": "Padded tokens per batch and process (pairs x longer side); 0: on a GPU the most its memory holds, "
                "up to --tokens_per_step (fewest batches a step, found by trial steps), on a CPU 4096."})
    pad_to_multiple_of: int = field(default=1, metadata={
        "help": "Pad each batch's source and target widths to a multiple of this (1: to the longest pair)."})
    compile: str = field(default="auto", metadata={
        "help": "torch.compile the training step: auto (inductor on a GPU, unless --dropout_epochs; eager on a CPU), "
                "no (eager), or a torch.compile backend (inductor, aot_eager, ...)."})
    tokens_per_step: int = field(default=25000, metadata={
        "help": "Tokens per optimizer step, reached by accumulation."})
    warmup_steps: int = 4000
    lr_scale: float = field(default=1.0, metadata={"help": "Multiplies the §5.3 learning rate curve."})
    label_smoothing: float = field(default=0.1, metadata={"help": "ε_ls (§5.4)."})
    max_grad_norm: float = field(default=0.0, metadata={
        "help": "Clip the step's gradient to this global L2 norm (0: no clipping, as in the paper)."})
    mixed_precision: str = field(default="auto", metadata={
        "help": "auto (GPUs: bf16, fp16 without bf16 or if accelerate launch names it; CPUs: accelerate launch's "
                "choice, else fp32), no, fp16, bf16 (on a CPU attention eager: training/step.py)."})
    fast_cpu: bool = field(default=True, metadata={
        "help": "On a CPU, train and decode with what whole calls were measured faster with on this machine, once "
                "(vaswani_hf.fast_cpu); --no_fast_cpu: as the model files are written."})
    fast_gpu: bool = field(default=True, metadata={
        "help": "On a GPU, each attention's projections of one input as one product (vaswani_hf.fast_gpu); "
                "--no_fast_gpu: one product each, as the model file writes them."})
    cudnn_attention: bool = field(default=False, metadata={
        "help": "On a GPU, let SDPA train with cuDNN's attention kernels, torch's first choice on Hopper GPUs; off by "
                "default: cuDNN builds a plan for each new batch shape, and batches change shape at every step."})
    deterministic: bool = field(default=False, metadata={
        "help": "Only kernels that give the same result from run to run (training/step.py): on a GPU, the same "
                "command and seed then give the same weights (a CPU run in eager mode gives them without it)."})
    logging_steps: int = 10
    report_to: list[str] = field(default_factory=lambda: ["tensorboard"], metadata={
        "help": "Where the loss and learning rate (every --logging_steps) and the validation scores go: "
                "Accelerate's trackers, tensorboard (in --output_dir), wandb, mlflow, trackio, comet_ml, aim, "
                "clearml, dvclive, swanlab; all: every one installed; none."})
    eval_steps: int = field(default=5000, metadata={"help": "Validation loss and BLEU every N steps (0: never)."})
    eval_max_sentences: int = field(default=500, metadata={"help": "Validation sentences decoded for BLEU."})
    save_steps: int = field(default=0, metadata={"help": "A checkpoint every N steps (0: off)."})
    save_minutes: float | None = field(default=None, metadata={
        "help": "A checkpoint every N minutes (0: off). Unset: the paper's 10, unless --save_steps or a budget "
                "(--max_train_minutes: spread over its last share) places them."})
    average_checkpoints: int = field(default=5, metadata={"help": "The final model averages the last K checkpoints."})
    num_beams: int = 4
    length_penalty_alpha: float = field(default=0.6, metadata={"help": "GNMT α (§6.1)."})
    extra_length: int = field(default=50, metadata={
        "help": "Tokens an output may run past its source's length, in the run's decoding and the saved model's "
                "(§6.1; §6.3's parser: 300)."})
    alpha_candidates: list[float] | None = field(default=None, metadata={
        "help": "GNMT α values to try on the whole validation set after training; the best replaces "
                "--length_penalty_alpha for the test set and the saved model (§6.1: α was chosen on the development "
                "set)."})
    evalb: bool = field(default=False, metadata={
        "help": "The targets are linearized constituency trees (training/treebank.py's): score them with EVALB's "
                "bracketing F1 as well, and choose α by it, skipped sentences missed (§6.3's parser; the parsing "
                "preset sets it)."})
    model_name_or_path: str | None = field(default=None, metadata={
        "help": "Fine-tune this vaswani_hf model (a folder or Hub id: a run's, or a converted one) instead of "
                "training a new one: its weights, architecture and tokenizer; the recipe is the flags'."})
    resume_from_checkpoint: str | None = field(default=None, metadata={"help": "A checkpoint folder, or latest."})
    enable_jit_checkpoint: bool = field(default=False, metadata={
        "help": "On SIGTERM (a preempted machine, a job's time limit), a checkpoint after the step under way, then "
                "stop with SIGTERM's status; resumed as any, never averaged (transformers' flag of that name)."})
    overwrite_output_dir: bool = field(default=False, metadata={
        "help": "Delete the run --output_dir holds and start afresh (without it, a folder that holds anything is "
                "refused; with it, one that holds what no run writes)."})
    push_to_hub: bool = False
    hub_model_id: str | None = None
    hub_private_repo: bool = False


def refuse_trackers(names: list[str]) -> None:
    """--report_to names Accelerate's trackers, each installed, or all, or none alone: else a one-line SystemExit (an
    unknown name was Accelerate's traceback after the data was read; a tracker not installed, a warning and no
    logs)."""
    from accelerate import tracking

    known = list(tracking.LOGGER_TYPE_TO_CLASS)
    if "none" in names and len(names) > 1:
        raise SystemExit(f"error: --report_to {' '.join(names)}: none stands alone")
    for name in [name for name in names if name not in ("all", "none")]:
        if name not in known:
            raise SystemExit(f"error: --report_to {name}: one of {', '.join(known)}, all, none")
        if name not in [str(tracker) for tracker in tracking.get_available_trackers()]:
            raise SystemExit(f"error: --report_to {name}: its package is not installed (pip install {name})")


def read_preset(name: str) -> dict:
    """training/presets/NAME.json without its comments; an unknown name is a one-line SystemExit listing them."""
    path = PRESETS / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"error: --preset {name}: no {path}; presets: {preset_names()}")
    preset = json.loads(path.read_text(encoding="utf-8"))
    return {key: value for key, value in preset.items() if not key.startswith("_")}


def parse_arguments(argv: list[str] | None = None) -> tuple[DataArguments, ModelArguments, RecipeArguments]:
    argv = sys.argv[1:] if argv is None else argv
    parser = HfArgumentParser((DataArguments, ModelArguments, RecipeArguments))
    first = parser.parse_args_into_dataclasses(argv, return_remaining_strings=True)[2]
    if first.preset:
        parser.set_defaults(**read_preset(first.preset))
    if first.model_name_or_path is not None:
        parser.set_defaults(**dict.fromkeys(DROPOUTS))  # not given: the start's
    data_args, model_args, args = parse_flags(parser, argv, "training/run.py")
    if args.model_name_or_path is not None:
        refuse_new_model_flags(argv, args.model_name_or_path)
    return data_args, model_args, args


def refuse_new_model_flags(argv: list[str], start: str) -> None:
    """With --model_name_or_path `start`, a flag that describes a new model (a preset, a model flag but the dropouts,
    the BPE's sample) is a one-line SystemExit: the model and its tokenizer are the start's."""
    given = {arg.split("=")[0] for arg in argv}
    sizes = [f"--{name}" for name in ModelArguments.__dataclass_fields__ if name not in DROPOUTS]
    for flag in ["--preset", "--bpe_sample", *sizes]:
        if flag in given:
            raise SystemExit(f"error: {flag} is a new model's: with --model_name_or_path, the config and tokenizer "
                             f"are {start}'s own")


def parsed_dataclasses(parser: HfArgumentParser, argv: list[str] | None) -> tuple:
    """HfArgumentParser's dataclasses and the words left; a dataclass that refuses its values (the Trainer's
    arguments: `--logging_steps 0`) is a one-line SystemExit, not a traceback."""
    try:
        return parser.parse_args_into_dataclasses(argv, return_remaining_strings=True)
    except ValueError as error:
        raise SystemExit(f"error: {first_line(error)}") from None


def parse_flags(parser: HfArgumentParser, argv: list[str] | None, script: str) -> tuple:
    """The parser's dataclasses from `argv` (None: the command line); a word that is none of their flags is a
    one-line SystemExit naming it and the nearest flag (one whose name ends with it first: run.py's --num_beams is
    run_trainer.py's --generation_num_beams), not HfArgumentParser's traceback."""
    *parsed, unknown = parsed_dataclasses(parser, argv)
    if unknown:
        flags = [f"--{field.name}" for kind in parser.dataclass_types for field in fields(kind)]
        word = unknown[0].split("=")[0]
        nearest = ([flag for flag in flags if flag.endswith(f"_{word.lstrip('-')}")]
                   or difflib.get_close_matches(word, flags, n=1, cutoff=0.8))
        hint = f" (did you mean {nearest[0]}?)" if nearest else ""
        raise SystemExit(f"error: {unknown[0]} is not a flag of {script}{hint}; --help lists them")
    return tuple(parsed)


def on_gpu() -> bool:
    """Whether the run trains on a GPU: one is there, and `accelerate launch --cpu` (or `accelerate config`'s CPU)
    did not ask for the CPU, which Accelerate then runs on whatever the run asks."""
    return torch.cuda.is_available() and os.environ.get("ACCELERATE_USE_CPU", "false").lower() != "true"


def chosen_precision(flag: str, gpu: bool) -> str:
    """The precision a run trains in for --mixed_precision `flag`. `auto`: on a GPU bf16, or fp16 where the GPU has no
    bf16 or `accelerate launch --mixed_precision` (or `accelerate config`) names fp16; on a CPU what the launcher
    names, bf16 or fp16, else float32 ("no", also the launcher's default)."""
    if flag != "auto":
        return flag
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION")
    if gpu:
        return "bf16" if torch.cuda.is_bf16_supported() and launcher != "fp16" else "fp16"
    return launcher if launcher in ("bf16", "fp16") else "no"


def check_arguments(data_args: DataArguments, model_args: ModelArguments, args: RecipeArguments, gpu: bool) -> None:
    """Every flag checked before any work: a wrong value is a one-line SystemExit naming the flag."""
    check_model_arguments(data_args, model_args)
    at_least = {"max_steps": (args.max_steps, 1), "max_tokens": (args.max_tokens, 0),
                "pad_to_multiple_of": (args.pad_to_multiple_of, 1),
                "tokens_per_step": (args.tokens_per_step, 1), "warmup_steps": (args.warmup_steps, 1),
                "logging_steps": (args.logging_steps, 1), "eval_steps": (args.eval_steps, 0),
                "eval_max_sentences": (args.eval_max_sentences, 1), "save_steps": (args.save_steps, 0),
                "save_minutes": (args.save_minutes or 0, 0), "average_checkpoints": (args.average_checkpoints, 1),
                "evaluations": (args.evaluations, 0), "num_beams": (args.num_beams, 1),
                "extra_length": (args.extra_length, 0), "max_grad_norm": (args.max_grad_norm, 0)}
    refuse_below(at_least)
    refuse_unless_positive({"lr_scale": args.lr_scale, "max_train_minutes": args.max_train_minutes})
    refuse_blank({"resume_from_checkpoint": args.resume_from_checkpoint, "hub_model_id": args.hub_model_id})
    for name in ("warmup_share", "cooldown_share", "average_share"):
        if not 0 <= getattr(args, name) <= 1:
            raise SystemExit(f"error: --{name} {getattr(args, name)}: must be between 0 and 1")
    refuse_seed_or_smoothing(args.seed, "label_smoothing", args.label_smoothing)
    if args.replay_schedule and args.max_train_minutes is None:
        raise SystemExit("error: --replay_schedule replays a budgeted run: give its flags, --max_train_minutes too")
    epochs = args.dropout_epochs
    if epochs is not None and not (len(epochs) == 2 and 0 <= epochs[0] < epochs[1]):
        raise SystemExit(f"error: --dropout_epochs {epochs}: two epoch counts E0 E1 with 0 <= E0 < E1")
    if data_args.streaming and data_args.bpe_sample is None and args.model_name_or_path is None:
        raise SystemExit(
            "error: --streaming needs --bpe_sample N: the joint BPE learns from the stream's first N pairs"
        )
    if data_args.streaming and epochs is not None:
        raise SystemExit("error: --dropout_epochs counts epochs of a corpus whose size --streaming does not know")
    refuse_unless_alpha(args.length_penalty_alpha)
    refuse_trackers(args.report_to)
    if not all(0 <= alpha < math.inf for alpha in args.alpha_candidates or []):
        raise SystemExit(f"error: --alpha_candidates {args.alpha_candidates}: each α must be finite and at least 0")
    launched = launcher_backend()
    backend, named = ((args.compile, f"--compile {args.compile}") if args.compile != "auto" else
                      (launched, f"accelerate launch --dynamo_backend {launched}"))
    if backend not in (None, "no"):
        from torch._dynamo import list_backends

        if backend not in list_backends(exclude_tags=()):
            raise SystemExit(f"error: {named}: auto, no, or one of {list_backends()}")
        if epochs is not None:
            raise SystemExit("error: --dropout_epochs changes P_drop at every step, which a compiled step would be "
                             f"compiled again for: add --compile no ({named} compiles it)")
    if args.mixed_precision not in ("auto", "no", "fp16", "bf16"):
        raise SystemExit(f"error: --mixed_precision {args.mixed_precision}: one of auto, no, fp16, bf16")
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if args.mixed_precision == "auto" and launcher not in ("no", "fp16", "bf16"):  # fp8: auto took bf16 without a word
        raise SystemExit(f"error: accelerate launch --mixed_precision {launcher}: run.py trains in no (float32), bf16 "
                         "or fp16")
    if chosen_precision(args.mixed_precision, gpu) == "fp16" and not gpu:
        asked = ("--mixed_precision fp16" if args.mixed_precision == "fp16" else
                 "accelerate launch --mixed_precision fp16")
        raise SystemExit(f"error: {asked} needs a GPU (float16 autocast is not run on the CPU): use no (float32) or "
                         "bf16")
    if args.push_to_hub:
        check_can_push(args.hub_model_id or Path(args.output_dir).name)
    # fast_cpu keeps its plan in the cache (a resumed run's checkpoints keep its own): one it cannot write, named now
    if args.fast_cpu and not gpu and not args.resume_from_checkpoint:
        try:
            writable(cache_root("fast_cpu"))
        except CacheNotWritable as error:
            raise SystemExit(f"error: {error}, or give --no_fast_cpu") from None


def check_model_arguments(data_args: DataArguments, model_args: ModelArguments) -> None:
    """The data and model flags of run.py and run_trainer.py, checked before the BPE is trained."""
    refuse_blank({name: getattr(data_args, name)  # a blank one is not the embedded data
                  for name in ("dataset_name", "dataset_config_name", "train_file", "validation_file", "test_file")})
    files = [f"--{name}" for name in ("train_file", "validation_file", "test_file") if getattr(data_args, name)]
    if data_args.dataset_name and files:  # (load_splits would read the dataset's splits and drop the files)
        raise SystemExit(f"error: --dataset_name and {files[0]}: a dataset brings its own splits; give a dataset or "
                         "files, not both")
    if data_args.dataset_config_name and not data_args.dataset_name:
        raise SystemExit(f"error: --dataset_config_name {data_args.dataset_config_name} names a configuration of "
                         "--dataset_name, which is not given")
    if data_args.source_lang == data_args.target_lang:  # a pair's two sides would be one text: a copy to learn
        raise SystemExit(f"error: --source_lang and --target_lang are both {data_args.source_lang}: name the data's "
                         "two languages")
    refuse_below({"max_length": (data_args.max_length, 1), "vocab_size": (model_args.vocab_size, 8),
                  "bpe_sample": (1 if data_args.bpe_sample is None else data_args.bpe_sample, 1),
                  "shuffle_buffer": (data_args.shuffle_buffer, 1)})
    try:  # the model's own checks (sizes, heads, dropout, positions), with a stand-in for the tokenizer's ids
        config = model_args.planned_config()
    except ValueError as error:
        raise SystemExit(f"error: {error}") from None
    if model_args.position_embedding == "learned" and data_args.max_length > config.max_position_embeddings:
        raise SystemExit(f"error: --max_length {data_args.max_length}: learned positions stop at "
                         f"{config.max_position_embeddings}")


def refuse_seed_or_smoothing(seed: int, smoothing_flag: str, smoothing: float) -> None:
    """A one-line SystemExit for a seed torch and NumPy do not take (0 to 2**32 - 1; set_seed's traceback, after the
    data is read, otherwise) or a label smoothing of 1 or more, which leaves the reference no more probability than
    any other token: nothing to learn."""
    if not 0 <= seed < 2**32:
        raise SystemExit(f"error: --seed {seed}: must be between 0 and {2**32 - 1}")
    if not 0 <= smoothing < 1:
        raise SystemExit(f"error: --{smoothing_flag} {smoothing}: must be at least 0 and below 1")


def refuse_blank(values: dict[str, str | None]) -> None:
    """A one-line SystemExit for the first flag given (not None) that is blank, as an unset shell variable gives."""
    for name, value in values.items():
        if value is not None and not value.strip():
            raise SystemExit(f"error: --{name} is blank: give one, or leave the flag out")


def refuse_below(values: dict[str, tuple[float, float]]) -> None:
    """A one-line SystemExit for the first flag whose value (NaN too) is below its least: {name: (value, least)}."""
    for name, (value, low) in values.items():
        if not value >= low:
            raise SystemExit(f"error: --{name} {value}: must be at least {low}")


def refuse_unless_alpha(value: float) -> None:
    """A one-line SystemExit unless --length_penalty_alpha is a GNMT α: finite and at least 0 (not NaN)."""
    if not 0 <= value < math.inf:
        raise SystemExit(f"error: --length_penalty_alpha {value}: must be finite and at least 0")


def refuse_unless_positive(values: dict[str, float | None]) -> None:
    """A one-line SystemExit for the first flag given (not None) that is not a positive finite number."""
    for name, value in values.items():
        if value is not None and not 0 < value < math.inf:
            raise SystemExit(f"error: --{name} {value}: must be positive and finite")


class _StandInTokenizer:
    """The special-token ids of training/tokenizer.py, for checking a configuration before the BPE is trained."""

    pad_token_id, bos_token_id, eos_token_id = 0, 1, 2

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size
