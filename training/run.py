"""Train a translation model with the recipe of "Attention Is All You Need" (§5), evaluate it (§6.1) and write a
Hub-ready folder.

    accelerate launch training/run.py --preset cpu-small          # embedded EN-DE data, ~5 min on 2 CPU cores
    accelerate launch training/run.py --preset base --dataset_name wmt14 --dataset_config_name de-en \\
        --source_lang en --target_lang de --output_dir runs/wmt14-base
    accelerate launch training/run.py --preset cpu-medium --train_file ../shared/data/multi30k/train \\
        --validation_file ../shared/data/multi30k/valid --test_file ../shared/data/multi30k/test2016
    accelerate launch --multi_gpu --num_processes 2 training/run.py ...   # data parallel (gloo on CPU)
    accelerate launch training/run.py --output_dir runs/x --resume_from_checkpoint latest

A preset (training/presets/NAME.json) sets the recipe; any flag overrides it. Without a preset the values are
the paper's base model and recipe. The recipe: a joint BPE (§5.1); batches of pairs grouped by length and
counted in tokens, accumulated to `tokens_per_step` (§5.1); Adam(0.9, 0.98, 1e-9) with warmup and inverse
square root decay (§5.3); dropout and label smoothing ε_ls = 0.1 (§5.4), the loss normalized by the target
tokens of the whole optimizer step; checkpoints averaged at the end; beam 4 with the GNMT length penalty
α = 0.6 and a limit of source length + 50 (§6.1); sacreBLEU and chrF.
"""

import json
import math
import os
import shutil
import sys
import time
from contextlib import nullcontext
from dataclasses import asdict
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast, set_seed
from tqdm.auto import tqdm
from transformers import AutoTokenizer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.arguments import DataArguments, RecipeArguments, check_arguments, parse_arguments  # noqa: E402
from training.averaging import average_checkpoints  # noqa: E402
from training.batching import padding_fraction, token_batches  # noqa: E402
from training.budget import TimeBudget, crossed  # noqa: E402
from training.checkpoints import (  # noqa: E402
    STATE_FILE,
    WEIGHTS_FILE,
    checkpoints,
    leave_timeline,
    load_checkpoint,
    resolve_checkpoint,
    save_checkpoint,
    share_kernel_choices,
    verified,
)
from training.data import load_run_pairs  # noqa: E402
from training.evaluation import score, translate  # noqa: E402
from training.faults import fault_point  # noqa: E402
from training.hub import write_output_folder  # noqa: E402
from training.loss import label_smoothed_nll  # noqa: E402
from training.schedule import inverse_sqrt_lr, paper_optimizer  # noqa: E402
from training.tokenizer import train_joint_bpe  # noqa: E402
from vaswani_hf import VaswaniForConditionalGeneration, keep_freed_memory  # noqa: E402
from vaswani_hf.kernels import KERNELS  # noqa: E402
from vaswani_hf.modeling_vaswani import shift_tokens_right  # noqa: E402

NOT_RECIPE = ("push_to_hub", "hub_model_id", "hub_private_repo", "resume_from_checkpoint", "output_dir",
              "overwrite_output_dir")
# The paper's recipe values (§5, §6.1) that a run may change; sizes are choices, not deviations.
PAPER_RECIPE = {"tokens_per_step": 25000, "warmup_steps": 4000, "lr_scale": 1.0, "label_smoothing": 0.1,
                "num_beams": 4, "length_penalty_alpha": 0.6}


def recipe_deviations(args: RecipeArguments) -> list[str]:
    """The recipe values of this run that differ from the paper's, for the model card."""
    changed = [f"`{name}={getattr(args, name)}` (paper: {paper})" for name, paper in PAPER_RECIPE.items()
               if getattr(args, name) != paper]
    if args.alpha_candidates:
        changed.append(f"GNMT α chosen on the validation set among {args.alpha_candidates}")
    if args.average_checkpoints not in (5, 20):
        changed.append(f"`average_checkpoints={args.average_checkpoints}` (paper: 5 for base, 20 for big)")
    if args.max_train_minutes is not None:
        cooldown = f", then to zero over the last {args.cooldown_share:.0%}" if args.cooldown_share else ""
        changed.append(f"a {args.max_train_minutes:g}-minute budget (training/budget.py): warmup over "
                       f"{args.warmup_share:.0%} of the steps the machine was measured to make in it, the §5.3 decay "
                       f"after it{cooldown}, the peak of the §5.3 curve for `warmup_steps`")
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


def encode(tokenizer, pairs, max_length=None):
    """Token ids of sources and targets; both end with </s>."""
    sources = tokenizer([s for s, _ in pairs])["input_ids"]
    targets = tokenizer([t for _, t in pairs])["input_ids"]
    if max_length:
        kept = [i for i in range(len(pairs)) if len(sources[i]) <= max_length and len(targets[i]) <= max_length]
        sources, targets = [sources[i] for i in kept], [targets[i] for i in kept]
    return sources, targets


def collate(indices, sources, targets, pad_id, device):
    """Right-padded source ids and mask, and labels with -100 at padding (the model shifts them itself)."""
    source_width = max(len(sources[i]) for i in indices)
    target_width = max(len(targets[i]) for i in indices)
    input_ids = torch.full((len(indices), source_width), pad_id)
    labels = torch.full((len(indices), target_width), -100)
    for row, i in enumerate(indices):
        input_ids[row, : len(sources[i])] = torch.tensor(sources[i])
        labels[row, : len(targets[i])] = torch.tensor(targets[i])
    return {"input_ids": input_ids.to(device), "attention_mask": input_ids.ne(pad_id).long().to(device),
            "labels": labels.to(device)}


@torch.no_grad()
def validation_loss(model, sources, targets, pad_id, max_tokens, device) -> float:
    """Per-token NLL on the validation set (no smoothing), for perplexity; the model's mode is given back."""
    training = model.training
    model.eval()
    total = count = 0.0
    for batch in token_batches([len(s) for s in sources], [len(t) for t in targets], max_tokens, seed=0, epoch=0):
        inputs = collate(batch, sources, targets, pad_id, device)
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=inputs["labels"]).logits
        _, nll, n = label_smoothed_nll(logits, inputs["labels"], 0.0)
        total, count = total + nll.item(), count + n.item()
    model.train(training)
    return total / max(count, 1)


def main():
    data_args, model_args, args = parse_arguments()
    output_dir = Path(args.output_dir)
    use_gpu = torch.cuda.is_available()
    check_arguments(data_args, model_args, args, use_gpu)
    mixed_precision = args.mixed_precision
    if mixed_precision == "auto":
        mixed_precision = ("bf16" if torch.cuda.is_bf16_supported() else "fp16") if use_gpu else "no"
    accelerator = Accelerator(cpu=not use_gpu, mixed_precision=mixed_precision, log_with="tensorboard",
                              project_dir=str(output_dir))
    resumed = check_output_dir(output_dir, args, asdict(model_args), accelerator.print)  # every process reads
    accelerator.wait_for_everyone()  # before anyone writes there
    if accelerator.is_main_process and resumed:
        for path in leave_timeline(resumed):
            accelerator.print(f"{path.name}: after {resumed.name}, so no longer part of this run")
    elif accelerator.is_main_process and args.overwrite_output_dir:
        shutil.rmtree(output_dir, ignore_errors=True)
    if not use_gpu:  # share the cores this process may use among the processes; keep freed memory (allocator.py)
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // accelerator.num_processes))
        keep_freed_memory()
    set_seed(args.seed)
    say = accelerator.print

    # Data and the joint BPE: trained once by the main process, read by every process.
    pairs = load_run_pairs(data_args)
    if accelerator.is_main_process and not resumed:
        tokenizer = train_joint_bpe((side for pair in pairs["train"] for side in pair), model_args.vocab_size)
        tokenizer.save_pretrained(output_dir)
    accelerator.wait_for_everyone()
    tokenizer = AutoTokenizer.from_pretrained(output_dir)
    train_sources, train_targets = encode(tokenizer, pairs["train"], data_args.max_length)
    source_lengths, target_lengths = [len(s) for s in train_sources], [len(t) for t in train_targets]
    validation = encode(tokenizer, pairs["validation"]) if "validation" in pairs else None

    config = model_args.config(tokenizer)
    model = VaswaniForConditionalGeneration(config)
    budget = None
    if args.max_train_minutes is not None:
        peak = inverse_sqrt_lr(args.warmup_steps, config.d_model, args.warmup_steps, args.lr_scale)
        try:
            budget = TimeBudget(60 * args.max_train_minutes, args.max_steps, peak, args.warmup_steps,
                                args.warmup_share, args.cooldown_share, args.average_share, args.average_checkpoints,
                                args.evaluations)
        except ValueError as error:
            raise SystemExit(str(error)) from None
    optimizer, scheduler = paper_optimizer(model, config.d_model, args.warmup_steps, args.lr_scale, budget=budget)
    model, optimizer = accelerator.prepare(model, optimizer)

    # §5.1 batching: every process builds the same batch list; an optimizer step takes
    # accumulation × processes consecutive batches, this process every num_processes-th of them.
    world, rank = accelerator.num_processes, accelerator.process_index
    accumulation = max(1, math.ceil(args.tokens_per_step / (args.max_tokens * world)))
    per_step = accumulation * world
    first_epoch = token_batches(source_lengths, target_lengths, args.max_tokens, args.seed, 0)
    steps_per_epoch = len(first_epoch) // per_step
    if steps_per_epoch == 0:
        raise SystemExit(f"{len(first_epoch)} batches cannot fill one optimizer step of {per_step}: lower --tokens_per_step")
    say(f"{len(train_sources)} training pairs, vocabulary {len(tokenizer)}, "
        f"{accelerator.unwrap_model(model).num_parameters() / 1e6:.1f}M parameters, {world} process(es), "
        f"{accumulation} accumulated batch(es) of <= {args.max_tokens} tokens per step, "
        f"padding {padding_fraction(first_epoch, source_lengths, target_lengths):.1%}")

    state = {"history": [], "elapsed_seconds": 0.0, "model": asdict(model_args)}
    step = 0
    if resumed:
        state = load_checkpoint(accelerator, resumed)
        step = state.pop("step")
        scheduler.load_state_dict({**state.pop("scheduler"), "lr_lambdas": [None]})  # JSON, not a pickle
        say(f"resumed from {resumed} at step {step}")
    hyperparameters = {**asdict(data_args), **asdict(model_args), **asdict(args)}
    accelerator.init_trackers("vaswani", config={k: str(v) if isinstance(v, list) else v for k, v in hyperparameters.items()})

    start_time = time.time() - state["elapsed_seconds"]

    def seconds() -> float:  # the run's time by the main process's clock, on every process
        now = torch.tensor([time.time() - start_time], dtype=torch.float64, device=accelerator.device)
        return broadcast(now).item()

    last_check = last_save = state["elapsed_seconds"]
    window_tokens, window_start = 0, time.time()
    progress = training_progress(budget, args.max_steps, step, last_check, not accelerator.is_local_main_process)
    model.train()
    epoch, batches = None, None
    while step < args.max_steps:
        elapsed = seconds()
        if budget:
            progress.update(min(elapsed, budget.seconds) - progress.n)
            if elapsed > budget.seconds:
                progress.close()
                say(f"time budget of {args.max_train_minutes:g} minutes reached at step {step}")
                break
            if step == 1:
                state["first_step_seconds"] = elapsed
            budget.estimate(step, elapsed, state.get("first_step_seconds", 0.0))
        if epoch != step // steps_per_epoch:
            epoch = step // steps_per_epoch
            batches = token_batches(source_lengths, target_lengths, args.max_tokens, args.seed, epoch)
        offset = (step % steps_per_epoch) * per_step
        mine = [batches[offset + a * world + rank] for a in range(accumulation)]
        inputs = [collate(b, train_sources, train_targets, tokenizer.pad_token_id, accelerator.device) for b in mine]
        local_tokens = sum(int(x["labels"].ne(-100).sum()) for x in inputs)
        step_tokens = accelerator.reduce(torch.tensor(local_tokens, device=accelerator.device), "sum").item()
        step_loss = torch.zeros((), device=accelerator.device)
        for a, batch in enumerate(inputs):
            with accelerator.no_sync(model) if a < accumulation - 1 else nullcontext(), accelerator.autocast():
                decoder_input_ids = shift_tokens_right(batch["labels"], config.pad_token_id, config.decoder_start_token_id)
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                               decoder_input_ids=decoder_input_ids).logits
                loss_sum, _, _ = label_smoothed_nll(logits, batch["labels"], args.label_smoothing)
                # DDP averages gradients over processes: scale so the sum over the step is divided by its tokens.
                accelerator.backward(loss_sum * world / step_tokens)
            step_loss += loss_sum.detach()
        learning_rate = scheduler.get_last_lr()[0]
        fault_point(f"step-{step + 1}")
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if not KERNELS.frozen:  # the first step measured them: the same kernels in every process and after a resume
            share_kernel_choices()
        loss = accelerator.reduce(step_loss, "sum").item() / step_tokens
        window_tokens += step_tokens
        entry = {"step": step, "loss": loss, "learning_rate": learning_rate, "tokens": step_tokens}
        state["history"].append(entry)
        if not budget:
            progress.update(1)
        if step % args.logging_steps == 0 or step == 1:
            tokens_per_second = window_tokens / (time.time() - window_start)
            window_tokens, window_start = 0, time.time()
            steps = {"step": f"{step}/~{budget.expected:.0f}"} if budget else {}
            progress.set_postfix(**steps, loss=f"{loss:.3f}", lr=f"{learning_rate:.2e}",
                                 tok_s=f"{tokens_per_second:.0f}")
            accelerator.log({"train/loss": loss, "train/learning_rate": learning_rate,
                             "train/target_tokens_per_second": tokens_per_second}, step=step)

        elapsed, previous = seconds(), last_check
        last_check = elapsed
        if budget and budget.evaluations:
            evaluate_now = crossed(previous, elapsed, budget.evaluation_interval()) and elapsed < budget.seconds
        else:
            evaluate_now = args.eval_steps and step % args.eval_steps == 0
        if validation and evaluate_now:
            if accelerator.is_main_process:
                metrics = evaluate_model(accelerator.unwrap_model(model), tokenizer, pairs["validation"], validation, args)
                entry.update({f"validation_{k}": v for k, v in metrics.items()})
                accelerator.log({f"validation/{k}": v for k, v in metrics.items() if isinstance(v, float)}, step=step)
                progress.write(f"step {step}: validation loss {metrics['loss']:.3f}, BLEU {metrics['bleu']:.1f}")
            accelerator.wait_for_everyone()

        if args.save_steps or args.save_minutes or not budget:
            save_now = (args.save_steps and step % args.save_steps == 0) or (
                args.save_minutes > 0 and elapsed - last_save > 60 * args.save_minutes)
        else:
            save_now = crossed(previous, elapsed, budget.save_interval())
        if save_now:
            state["elapsed_seconds"] = elapsed
            state["scheduler"] = scheduler_state(scheduler)
            save_checkpoint(accelerator, output_dir, step, state, keep=args.average_checkpoints)
            last_save = elapsed
    progress.close()

    # The final model: the average of the last K checkpoints (§6.1), the current weights among them.
    state["elapsed_seconds"] = time.time() - start_time
    state["scheduler"] = scheduler_state(scheduler)
    if not checkpoints(output_dir) or checkpoints(output_dir)[-1].name != f"checkpoint-{step}":
        save_checkpoint(accelerator, output_dir, step, state, keep=args.average_checkpoints)
    if accelerator.is_main_process:
        averaged = verified(checkpoints(output_dir), say, only=(WEIGHTS_FILE,))[-args.average_checkpoints:]
        if not averaged:
            raise SystemExit(f"error: every checkpoint in {output_dir} is damaged: nothing to average")
        final = VaswaniForConditionalGeneration(config)
        missing, unexpected = final.load_state_dict(average_checkpoints([p / WEIGHTS_FILE for p in averaged]), strict=False)
        if unexpected or set(missing) - set(final.all_tied_weights_keys):  # only tied copies may be absent
            raise RuntimeError(f"averaged checkpoints do not fit the model: missing {missing}, unexpected {unexpected}")
        final.tie_weights()
        fault_point("average")
        final.to(accelerator.device)
        metrics = {"train_steps": step, "train_minutes": state["elapsed_seconds"] / 60,
                   "averaged_checkpoints": [p.name for p in averaged], "history": state["history"]}
        if validation:  # the whole validation set, decoded with each candidate α (§6.1) and scored
            scores = choose_alpha(final, tokenizer, pairs["validation"], args)
            if len(scores) > 1:
                metrics["alpha_search"] = {alpha: scored["bleu"] for alpha, scored in scores.items()}
                args.length_penalty_alpha = max(scores, key=lambda alpha: scores[alpha]["bleu"])
                say(f"GNMT α by validation BLEU: {metrics['alpha_search']} -> {args.length_penalty_alpha}")
            loss = validation_loss(final, *validation, tokenizer.pad_token_id, args.max_tokens, accelerator.device)
            metrics["validation"] = {"loss": loss, "perplexity": math.exp(min(loss, 50)),
                                     **scores[args.length_penalty_alpha]}
            say(f"validation: sacreBLEU {metrics['validation']['bleu']:.1f}  chrF {metrics['validation']['chrf']:.1f}")
        if "test" in pairs:
            sources = [s for s, _ in pairs["test"]]
            predictions = translate(final, tokenizer, sources, num_beams=args.num_beams, alpha=args.length_penalty_alpha)
            metrics["test"] = score(predictions, [t for _, t in pairs["test"]])
            say(f"test: sacreBLEU {metrics['test']['bleu']:.1f}  chrF {metrics['test']['chrf']:.1f}  "
                f"({metrics['test']['bleu_signature']})")
            for source, prediction in list(zip(sources, predictions))[:5]:
                say(f"  {source}\n  -> {prediction}")
        recipe = {**asdict(model_args), **{k: v for k, v in asdict(args).items() if k not in NOT_RECIPE}}
        write_output_folder(
            final, tokenizer, output_dir, metrics, dataset=dataset_description(data_args),
            source_lang=data_args.source_lang, target_lang=data_args.target_lang,
            model_id=args.hub_model_id or output_dir.name, recipe=recipe,
            deviations=recipe_deviations(args), num_beams=args.num_beams, alpha=args.length_penalty_alpha,
        )
        say(f"model, tokenizer, metrics and model card in {output_dir}")
        if args.push_to_hub:
            from training.hub import push

            url = push(output_dir, args.hub_model_id or output_dir.name, private=args.hub_private_repo)
            say(f"pushed to {url}")
    accelerator.wait_for_everyone()
    accelerator.end_training()


def check_output_dir(output_dir: Path, args, model: dict, say) -> Path | None:
    """The checkpoint to resume from, intact and of this model; or None for a fresh run, whose folder must be new or
    empty unless --overwrite_output_dir. Only reads: a refused run has changed nothing."""
    if not args.resume_from_checkpoint:
        if output_dir.exists() and not output_dir.is_dir():
            raise SystemExit(f"error: --output_dir {output_dir} is a file")
        if output_dir.is_dir() and any(output_dir.iterdir()) and not args.overwrite_output_dir:
            raise SystemExit(f"error: --output_dir {output_dir} is not empty: resume its run with --resume_from_checkpoint "
                             "latest, replace it with --overwrite_output_dir, or choose another folder")
        return None
    if args.overwrite_output_dir:
        raise SystemExit("error: --overwrite_output_dir deletes the run that --resume_from_checkpoint resumes: give one")
    try:
        path = resolve_checkpoint(output_dir, args.resume_from_checkpoint, say)
    except FileNotFoundError as error:
        raise SystemExit(f"error: {error}") from None
    if path.resolve().parent != output_dir.resolve():
        raise SystemExit(f"error: --resume_from_checkpoint {path} is not a checkpoint of --output_dir {output_dir}")
    if not (output_dir / "tokenizer.json").is_file():
        raise SystemExit(f"error: --output_dir {output_dir} has no tokenizer.json: the run's tokenizer is needed to resume it")
    saved = json.loads((path / STATE_FILE).read_text()).get("model", model)
    changed = [f"--{k} {model[k]} (the checkpoint's: {saved.get(k)})" for k in model if saved.get(k) != model[k]]
    if changed:
        raise SystemExit(f"error: {path} holds another model: {', '.join(changed)}")
    return path


def scheduler_state(scheduler) -> dict:
    """The learning-rate schedule's position as JSON (its curve is code, rebuilt from the flags)."""
    return {k: v for k, v in scheduler.state_dict().items() if k != "lr_lambdas"}


def training_progress(budget, max_steps, step, elapsed, disable):
    """A progress bar in steps; with a time budget, in seconds of it (the steps made and expected alongside)."""
    every = {"disable": disable, "mininterval": 1 if sys.stderr.isatty() else 30}
    if budget is None:
        return tqdm(total=max_steps, initial=step, desc="training", **every)
    return tqdm(total=round(budget.seconds), initial=elapsed, desc=f"training, {budget.seconds / 60:g}-minute budget",
                bar_format="{desc}: {percentage:3.0f}%|{bar}| {n:.0f}/{total} s{postfix}", **every)


def choose_alpha(model, tokenizer, pairs, args) -> dict[float, dict]:
    """sacreBLEU and chrF of the pairs for each candidate GNMT α, or for --length_penalty_alpha alone (§6.1: α was
    "chosen after experimentation on the development set")."""
    sources, references = [s for s, _ in pairs], [t for _, t in pairs]
    return {alpha: score(translate(model, tokenizer, sources, num_beams=args.num_beams, alpha=alpha), references)
            for alpha in args.alpha_candidates or [args.length_penalty_alpha]}


def evaluate_model(model, tokenizer, pairs, encoded, args, sentences=None) -> dict:
    """Validation loss on every pair; BLEU and chrF on the first `sentences` (--eval_max_sentences)."""
    loss = validation_loss(model, *encoded, tokenizer.pad_token_id, args.max_tokens, next(model.parameters()).device)
    subset = pairs[: sentences or args.eval_max_sentences]
    predictions = translate(model, tokenizer, [s for s, _ in subset], num_beams=args.num_beams,
                            alpha=args.length_penalty_alpha)
    metrics = score(predictions, [t for _, t in subset])
    return {"loss": loss, "perplexity": math.exp(min(loss, 50)), **metrics}


if __name__ == "__main__":
    main()
