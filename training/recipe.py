"""The recipe as the model card states it: what a run changed from the paper's (§5, §6.1), and its data."""

from dataclasses import dataclass
from pathlib import Path

from training.arguments import DataArguments, RecipeArguments
from training.schedules import PAPER_SAVE_MINUTES, checkpoint_minutes

NOT_RECIPE = ("push_to_hub", "hub_model_id", "hub_private_repo", "resume_from_checkpoint", "output_dir",
              "overwrite_output_dir", "fast_cpu", "fast_gpu", "replay_schedule", "compile", "enable_jit_checkpoint",
              "model_name_or_path")  # a start is named as the card's base model, never by its path
# The paper's recipe values (§5, §6.1) that a run may change; sizes are choices, not deviations. Its parser (§6.3)
# decodes otherwise: the card names both.
PAPER_RECIPE = {"tokens_per_step": 25000, "warmup_steps": 4000, "lr_scale": 1.0, "label_smoothing": 0.1,
                "num_beams": 4, "length_penalty_alpha": 0.6, "extra_length": 50}
PAPER_PARSER = {"num_beams": 21, "length_penalty_alpha": 0.3, "extra_length": 300}


def changed_values(values: dict) -> list[str]:
    """"`name=value` (paper: ...)" for each of `values` that differs from the paper's recipe (None: a converted
    model's decoding, which the card states)."""
    return [f"`{name}={value}` (paper: {PAPER_RECIPE[name]}"
            + (f"; its parser, §6.3: {PAPER_PARSER[name]})" if name in PAPER_PARSER else ")")
            for name, value in values.items() if value not in (PAPER_RECIPE[name], None)]


def search_flags(args) -> list[str]:
    """The flags of the paper's search (§6.1) that `args` set to other values than the paper's."""
    return [name for name in ("length_penalty_alpha", "extra_length") if getattr(args, name) != PAPER_RECIPE[name]]


def recipe_deviations(args: RecipeArguments, data_args: DataArguments) -> list[str]:
    """The recipe values of this run that differ from the paper's, for the model card."""
    changed = changed_values({name: getattr(args, name) for name in PAPER_RECIPE})
    if data_args.bpe_sample:
        first = "the first" if data_args.streaming else "a random sample of"
        changed.append(f"the joint BPE learned from {first} {data_args.bpe_sample:,} training pairs")
    if data_args.streaming:
        changed.append(f"the training pairs streamed, grouped by length {data_args.shuffle_buffer:,} at a time "
                       "(training/streaming.py)")
    if args.max_grad_norm:
        changed.append(f"gradients clipped to a global L2 norm of {args.max_grad_norm:g} (paper: no clipping)")
    if args.alpha_candidates:
        changed.append(f"GNMT α chosen on the validation set among {args.alpha_candidates}")
    if args.average_checkpoints not in (5, 20):
        changed.append(f"`average_checkpoints={args.average_checkpoints}` (paper: 5 for base, 20 for big)")
    if args.max_train_minutes is not None:
        cooldown = f", then to zero over the last {args.cooldown_share:.0%}" if args.cooldown_share else ""
        changed.append(f"a {args.max_train_minutes:g}-minute budget (training/budget.py): warmup over "
                       f"{args.warmup_share:.0%} of the steps the machine was measured to make in it, the §5.3 decay "
                       f"after it{cooldown}, the peak of the §5.3 curve for `warmup_steps`")
    if args.dropout_epochs:
        start, full = args.dropout_epochs
        changed.append(f"P_drop fitted to the epochs the run was expected to make (training/budget.py): none up to "
                       f"{start:g}, rising linearly to the recipe's `dropout` at {full:g} (the run's last value "
                       "below)")
    if args.max_train_minutes is not None and not (args.save_steps or args.save_minutes):
        changed.append(f"the averaged checkpoints spread over the last {args.average_share:.0%} of the budget")
    elif (minutes := checkpoint_minutes(args), args.save_steps) != (PAPER_SAVE_MINUTES, 0):
        every = " and ".join(filter(None, (minutes and each(minutes, "minute"),
                                           args.save_steps and each(args.save_steps, "step"))))
        paper = f"(paper: {each(PAPER_SAVE_MINUTES, 'minute')})"
        changed.append(f"checkpoints {every} {paper}" if every else f"no checkpoints before the last step {paper}")
    return [f"recipe: {text}" for text in changed]


def each(count: float, unit: str) -> str:
    """"every minute", "every 500 steps"."""
    return f"every {unit}" if count == 1 else f"every {count:g} {unit}s"


@dataclass
class TrainingData:
    """The data as the model card states it."""

    description: str  # what it is and where it came from, as the user named it
    dataset_id: str | None  # a Hub dataset id for the card's metadata
    license: str | None  # for the card's metadata; None: none claimed
    synthetic: bool  # the embedded grammar: the card warns that the model translates no real language
    sizes: dict[str, int | str]  # pairs per split ("streamed": not counted)
    example: str  # a source sentence for the card's code samples


def training_data(data_args: DataArguments, pairs: dict) -> TrainingData:
    """The card's account of a run's data flags and the pairs they gave (per split, a list of (source, target) or a
    dataset of `source` and `target`)."""
    sizes = {split: len(rows) if hasattr(rows, "__len__") else "streamed" for split, rows in pairs.items()}
    first = next(iter(pairs.get("test") or pairs.get("validation") or pairs["train"]))
    example = first["source"] if isinstance(first, dict) else first[0]
    if data_args.dataset_name:
        config = f" ({data_args.dataset_config_name})" if data_args.dataset_config_name else ""
        local = Path(data_args.dataset_name)  # as datasets reads it: a folder here is local data, no Hub id
        named, hub_id = ((f"the local dataset folder {local.resolve().name}", None) if local.is_dir()  # no path here
                         else (f"the Hub dataset {data_args.dataset_name}", data_args.dataset_name))
        return TrainingData(named + config, data_args.card_dataset or hub_id, data_args.card_license, False, sizes,
                            example)
    if data_args.train_file:
        files = {"train": data_args.train_file, "validation": data_args.validation_file, "test": data_args.test_file}
        names = "; ".join(f"{split}: {file_names(path, data_args)}" for split, path in files.items() if path)
        return TrainingData(f"local files ({names})", data_args.card_dataset, data_args.card_license, False, sizes,
                            example)
    return TrainingData("the embedded synthetic English-German grammar of vaswani_hf (training/default_data.py)",
                        None, data_args.card_license or "apache-2.0", True, sizes, example)


def file_names(path: str, data_args: DataArguments) -> str:
    """A data flag's file names, without the folders above them: `train.jsonl`, or `train.en` + `train.de`."""
    name = Path(path).name
    return name if Path(path).is_file() else f"{name}.{data_args.source_lang} + {name}.{data_args.target_lang}"
