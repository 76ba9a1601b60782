"""The recipe as the model card states it: what a run changed from the paper's (§5, §6.1), and its data."""

from training.arguments import DataArguments, RecipeArguments

NOT_RECIPE = ("push_to_hub", "hub_model_id", "hub_private_repo", "resume_from_checkpoint", "output_dir",
              "overwrite_output_dir", "fast_cpu", "replay_schedule")
# The paper's recipe values (§5, §6.1) that a run may change; sizes are choices, not deviations.
PAPER_RECIPE = {"tokens_per_step": 25000, "warmup_steps": 4000, "lr_scale": 1.0, "label_smoothing": 0.1,
                "num_beams": 4, "length_penalty_alpha": 0.6}


def recipe_deviations(args: RecipeArguments) -> list[str]:
    """The recipe values of this run that differ from the paper's, for the model card."""
    changed = [f"`{name}={getattr(args, name)}` (paper: {paper})" for name, paper in PAPER_RECIPE.items()
               if getattr(args, name) != paper]
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
                       f"{start:g}, rising linearly to the recipe's `dropout` at {full:g} (the run's last value below)")
    if args.max_train_minutes is not None and not (args.save_steps or args.save_minutes):
        changed.append(f"the averaged checkpoints spread over the last {args.average_share:.0%} of the budget")
    elif args.save_minutes != 10:
        every = f"{args.save_minutes} minutes" if args.save_minutes else f"{args.save_steps} steps"
        changed.append(f"checkpoints every {every} (paper: every 10 minutes)")
    return [f"recipe: {text}" for text in changed]


def dataset_description(data_args: DataArguments) -> str:
    if data_args.dataset_name:
        return " ".join(filter(None, (data_args.dataset_name, data_args.dataset_config_name)))
    return "local files" if data_args.train_file else "vaswani_hf embedded EN-DE grammar"
