"""Train a translation model with the recipe of "Attention Is All You Need" (§5), evaluate it (§6.1) and write a
Hub-ready folder.

    accelerate launch training/run.py --preset cpu-small          # embedded EN-DE data, ~5 min on 2 CPU cores
    accelerate launch training/run.py --preset base --dataset_name wmt14 --dataset_config_name de-en \\
        --source_lang en --target_lang de --output_dir runs/wmt14-base
    accelerate launch training/run.py --preset cpu-medium --train_file ../shared/data/multi30k/train \\
        --validation_file ../shared/data/multi30k/valid --test_file ../shared/data/multi30k/test2016
    accelerate launch training/run.py --preset parsing --source_lang en --target_lang tree \\
        --train_file train.jsonl --validation_file dev.jsonl --test_file test.jsonl   # §6.3 (training/treebank.py)
    accelerate launch --multi_gpu --num_processes 2 training/run.py ...   # data parallel (gloo on CPU)
    accelerate launch --use_fsdp --fsdp_version 2 --num_processes 2 training/run.py ...   # sharded (FSDP2)
    accelerate launch training/run.py --output_dir runs/x --resume_from_checkpoint latest
    accelerate launch training/run.py --model_name_or_path outputs/run --lr_scale 0.1 --train_file ...   # fine-tune

A preset (training/presets/NAME.json) sets the recipe; any flag overrides it. Without a preset the values are
the paper's base model and recipe. The recipe: a joint BPE (§5.1); batches of pairs grouped by length and
counted in tokens, accumulated to `tokens_per_step` (§5.1); Adam(0.9, 0.98, 1e-9) with warmup and inverse
square root decay (§5.3); dropout and label smoothing ε_ls = 0.1 (§5.4), the loss normalized by the target
tokens of the whole optimizer step; checkpoints averaged at the end; beam 4 with the GNMT length penalty
α = 0.6 and a limit of source length + 50 (§6.1); sacreBLEU and chrF (with --evalb, a parser's trees: EVALB's
bracketing F1 too). When the run stops, validates and saves is its schedule's answer (training/schedules.py): the
paper's steps, a time budget, or a budgeted run replayed.

`--model_name_or_path` fine-tunes a vaswani_hf model (a folder or Hub id) instead of a new one: its weights, sizes and
tokenizer, with this recipe from its first step (a size flag, a preset or --bpe_sample is refused; --dropout and the
other two, §5.4's, are the recipe's, over its own). One that decodes the paper's way keeps doing so; a converted one
(vaswani-convert) keeps the decoding it was published with, with --num_beams beams, and its tokenizer's own ids on each
side (training/tokens.py).
"""

import copy
import functools
import json
import math
import re
import shutil
import signal
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.fsdp_request import check_fsdp_request, said_once

check_fsdp_request()  # before torch and transformers load: a launch that cannot be honoured stops in a moment

import torch
from accelerate import Accelerator
from accelerate.utils import broadcast, broadcast_object_list, gather_object, set_seed
from transformers import AutoTokenizer, GenerationConfig, PreTrainedTokenizerBase
from transformers.utils.logging import disable_progress_bar

from training.arguments import DROPOUTS, check_arguments, chosen_precision, on_gpu, parse_arguments
from training.averaging import averaged_model
from training.batching import EpochBatches, collate, encode
from training.budget import TimeBudget, read_schedule, set_dropout
from training.checkpoints import (
    STATE_FILE,
    SigtermCheckpoint,
    checkpoints,
    leave_timeline,
    load_checkpoint,
    preempted,
    resolve_checkpoint,
    save_checkpoint,
    stopped_in_one_line,
    writing,
)
from training.data import DataError, as_pairs, load_run_data
from training.distributed import (
    clip_gradients,
    describe,
    held_parameters,
    prepare,
    share_cores,
    whole_model,
)
from training.evaluation import check_trees, evaluate_model, final_evaluation, reported
from training.faults import fault_point
from training.hub import save_tokenizer, set_run_decoding, start_decoding, write_output_folder
from training.recipe import NOT_RECIPE, recipe_deviations, search_flags, training_data
from training.schedule import inverse_sqrt_lr, paper_optimizer
from training.schedules import Budgeted, Replayed, Steps
from training.step import (
    Diverged,
    TrainingStep,
    compile_backend,
    deterministic_kernels,
    largest_batch,
    read_values,
    slow_bfloat16,
    training_config,
)
from training.streaming import StreamedBatches
from training.tokenizer import corpus_texts, train_joint_bpe
from training.tokens import pair_encoder, token_dataset
from vaswani_hf import VaswaniForConditionalGeneration, fast_cpu, fast_gpu, keep_freed_memory
from vaswani_hf.tools.export import check_output_place
from vaswani_hf.tools.loading import checked, learned_positions, loaded_whole
from vaswani_hf.tools.text import utf8_output


@stopped_in_one_line(DataError, Diverged)  # a stream's bad line where it is read, a NaN loss, a full disk, Ctrl-C
def main():
    utf8_output()
    with said_once():  # checks that every process makes alike, before any work
        data_args, model_args, args = parse_arguments()
        output_dir = Path(args.output_dir)
        check_arguments(data_args, model_args, args, on_gpu())
        if args.num_beams == 1:  # greedy decoding: no α to choose (a preset's candidates)
            args = replace(args, alpha_candidates=None)
        replay = read_schedule(args.replay_schedule) if args.replay_schedule else None  # a budgeted run's record
        start = args.model_name_or_path
        start_config, start_tokenizer, start_generation = (
            fine_tuning_start(start, model_args, data_args.max_length, args) if start else (None, None, None))
        accelerator, distributed = start_processes(args)
        model_id = ({"model_name_or_path": start, **{name: getattr(start_config, name) for name in DROPOUTS}} if start
                    else asdict(model_args))  # what a resumed run must match
        resumed = open_output_dir(accelerator, output_dir, args, model_id, data_args.streaming)
    say = accelerator.print
    disable_progress_bar()  # transformers' bar for each checkpoint's weights, within the run's own

    data, tokenizer = run_data(accelerator, data_args, model_args.vocab_size, args, output_dir, resumed,
                               start_tokenizer)
    pairs = {split: as_pairs(rows) for split, rows in data.items() if split != "train"}  # validation, test: small
    validation = encode(tokenizer, pairs["validation"]) if "validation" in pairs else None

    # The model, its optimizer (§5.3) and the batches of each step (§5.1). Speed, for the model and every copy
    # evaluated: on a CPU, training and decoding as whole calls were measured faster on this machine, once
    # (vaswani_hf.fast_cpu); on a GPU, fewer kernel launches (vaswani_hf.fast_gpu).
    config = start_config or model_args.config(tokenizer)
    generation = start_generation or GenerationConfig.from_model_config(config)  # every copy's and checkpoint's
    if set_run_decoding(generation, args.num_beams, args.length_penalty_alpha, args.extra_length) is None:
        args = replace(args, length_penalty_alpha=None)  # a converted start's: evaluated and saved as published
    plan = run_plan(accelerator, config, resumed) if accelerator.device.type == "cpu" and args.fast_cpu else None
    speed = {"cpu": plan and functools.partial(fast_cpu, plan=plan), "cuda": fast_gpu if args.fast_gpu else None}.get(
        accelerator.device.type) or (lambda model: model)

    def new_model(weights_of: str | None = None, config=config):
        """A model of `config` and the run's decoding: new weights, or those of the model `weights_of` names."""
        built = (VaswaniForConditionalGeneration(config) if weights_of is None else
                 VaswaniForConditionalGeneration.from_pretrained(weights_of, config=config, dtype=torch.float32))
        built.generation_config = copy.deepcopy(generation)
        return speed(built)

    trained = training_config(config, accelerator.device, accelerator.mixed_precision)  # on a CPU under bf16: eager
    model = new_model(None if resumed else start, trained)
    max_tokens = batch_tokens(accelerator, model, resumed, args, data_args.max_length)
    budget = time_budget(args, config.d_model)
    model, optimizer, scheduler = prepare(
        accelerator, model,
        lambda m: paper_optimizer(m, config.d_model, args.warmup_steps, args.lr_scale, budget=budget))
    distributed["parameters_held_by_the_main_process"] = held_parameters(model)
    batches = training_batches(accelerator, model, data["train"], data_args, tokenizer, max_tokens, args, output_dir,
                               distributed)
    backend = compile_backend(args.compile, accelerator.device, bool(args.dropout_epochs))
    train_step = TrainingStep(accelerator, model, args.label_smoothing, backend, args.cudnn_attention)
    if backend:
        say(f"the training step is compiled by torch.compile ({backend}): the first steps wait for it")

    run = Run(accelerator, model, optimizer, scheduler, batches, train_step, args, output_dir,
              tokenizer, data_args.streaming,
              {"history": [], "elapsed_seconds": 0.0, "model": model_id, "max_tokens": max_tokens,
               "fast_cpu_plan": plan})
    step = run.resume(resumed) if resumed else 0
    hyperparameters = {**asdict(data_args), **(model_id if start else asdict(model_args)), **asdict(args)}
    accelerator.init_trackers(
        "vaswani", config={k: str(v) if isinstance(v, list) else v for k, v in hyperparameters.items()})
    schedule = run_schedule(run, config.dropout, validation is not None, budget, replay)

    def validate(step: int, entry: dict) -> None:  # every process: the model may be sharded
        evaluated = whole_model(accelerator, model, new_model)
        if accelerator.is_main_process:
            metrics = evaluate_model(evaluated, tokenizer, pairs["validation"], validation, args)
            entry.update({f"validation_{k}": v for k, v in metrics.items()})
            accelerator.log({f"validation/{k}": v for k, v in metrics.items() if isinstance(v, float)}, step=step)
            say(f"step {step}: validation loss {metrics['loss']:.3f}, {reported(metrics)}")
        accelerator.wait_for_everyone()

    step = train(run, schedule, step, validate)

    # The final model: the average of the last K checkpoints (§6.1), the current weights among them.
    run.state["elapsed_seconds"] = run.seconds(shared=False)
    kept = checkpoints(output_dir)
    if not kept or kept[-1].name != f"checkpoint-{step}" or preempted(kept[-1]):  # the last weights: averaged too
        run.save(step, run.state["elapsed_seconds"])
    if accelerator.is_main_process:
        if written := schedule.written(step):
            (output_dir / "schedule.json").write_text(json.dumps(written, indent=1), encoding="utf-8")
        final, averaged = averaged_model(output_dir, config, args.average_checkpoints, say)
        final.generation_config = copy.deepcopy(generation)
        speed(final)
        fault_point("average")
        final.to(accelerator.device)
        metrics = {"train_steps": step, "train_minutes": run.state["elapsed_seconds"] / 60, "distributed": distributed,
                   "max_tokens": max_tokens, "compiled_graphs": train_step.compilations(),
                   "averaged_checkpoints": [p.name for p in averaged], "history": run.state["history"]}
        evaluated, alpha = final_evaluation(final, tokenizer, pairs, validation, args, say, data_args.target_lang)
        with writing(output_dir, "the model"):
            publish(final, tokenizer, output_dir, {**metrics, **evaluated}, {"train": data["train"], **pairs}, alpha,
                    data_args, model_args, args, say)
    accelerator.wait_for_everyone()
    accelerator.end_training()


@dataclass
class Run:
    """What a run's steps change, and its checkpoints keep."""

    accelerator: Accelerator
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    batches: EpochBatches | StreamedBatches
    train_step: TrainingStep
    args: object  # RecipeArguments
    output_dir: Path
    tokenizer: PreTrainedTokenizerBase  # its padding id for batches; saved in each checkpoint
    streaming: bool
    state: dict  # the checkpoint's state: history, elapsed seconds, the schedule's record, ...

    def __post_init__(self):
        self.start_time = time.time()

    def resume(self, checkpoint: Path) -> int:
        """The run's state from `checkpoint`, its clock set back by the seconds it had run: its step."""
        decided = {key: self.state[key] for key in ("max_tokens", "fast_cpu_plan")}  # chosen before: for the run
        self.state = {**load_checkpoint(self.accelerator, self.model, self.optimizer, checkpoint), **decided}
        step = self.state.pop("step")
        self.scheduler.load_state_dict({**self.state.pop("scheduler"), "lr_lambdas": [None]})  # JSON, not a pickle
        if self.streaming:
            self.batches.resume(self.state["stream"][self.accelerator.process_index])
        self.start_time = time.time() - self.state["elapsed_seconds"]
        self.accelerator.print(f"resumed from {checkpoint} at step {step}")
        return step

    def seconds(self, shared: bool = True) -> float:
        """The run's time, its validations left out; `shared`: by the main process's clock, on every process."""
        if not shared or self.accelerator.num_processes == 1:
            return time.time() - self.start_time  # nothing to share: no tensor whose reading would wait for a GPU
        now = torch.tensor([time.time() - self.start_time], dtype=torch.float64, device=self.accelerator.device)
        return broadcast(now).item()

    def save(self, step: int, elapsed: float, on_sigterm: bool = False) -> None:
        """A checkpoint after `step` steps and `elapsed` seconds (every process calls this); `on_sigterm`: not the
        schedule's (training/checkpoints.py)."""
        self.state["elapsed_seconds"] = elapsed
        self.state["scheduler"] = {k: v for k, v in self.scheduler.state_dict().items() if k != "lr_lambdas"}
        if self.streaming:  # every process's place in its part of the stream
            self.state["stream"] = gather_object([self.batches.position()])
        save_checkpoint(self.accelerator, self.model, self.optimizer, self.output_dir, step, self.state,
                        keep=self.args.average_checkpoints, tokenizer=self.tokenizer, on_sigterm=on_sigterm)


def train(run: Run, schedule: Steps, step: int, validate) -> int:
    """Optimizer steps from `step` on, validated and saved when the schedule says, until it ends the run: the last
    step's number. Losses stay on the device, read every --logging_steps."""
    accelerator, args, model = run.accelerator, run.args, run.model
    last_check = run.state["elapsed_seconds"]
    window_tokens, window_start = 0, time.time()
    unread = []  # history entries whose loss (and gradient norm) are still on the device
    read = functools.partial(read_values, finite=accelerator.mixed_precision != "fp16")  # no checkpoint of NaNs
    compiled = 0  # graphs torch.compile has made for the step
    model.train()
    with (schedule.progress(step, last_check, not accelerator.is_local_main_process) as progress,  # closed on errors
          SigtermCheckpoint(args.enable_jit_checkpoint) as sigterm):
        while True:
            elapsed = run.seconds()
            progress.update(schedule.position(step, elapsed) - progress.n)
            if ended := schedule.next_step(step, elapsed):
                break
            if (p_drop := schedule.dropout()) is not None:  # config.json keeps the last value
                set_dropout(model, p_drop)
            ids = run.batches.step(step)
            inputs = [collate(range(len(sources)), sources, targets, run.tokenizer.pad_token_id, accelerator.device,
                              args.pad_to_multiple_of) for sources, targets in ids]
            loss, step_tokens = run.train_step(inputs, sum(len(t) for _, targets in ids for t in targets))
            fault_point(f"step-{step + 1}")
            learning_rate = run.scheduler.get_last_lr()[0]
            entry = {"step": step + 1, "loss": loss, "learning_rate": learning_rate, "tokens": step_tokens}
            if args.max_grad_norm:
                entry["grad_norm"] = clip_gradients(accelerator, model, args.max_grad_norm)
            run.optimizer.step()
            run.scheduler.step()
            run.optimizer.zero_grad(set_to_none=True)
            step += 1
            window_tokens += step_tokens
            run.state["history"].append(entry)
            unread.append(entry)
            if step % args.logging_steps == 0 or step == 1:
                read(unread)  # the one wait for the device in `logging_steps` steps
                tokens_per_second = window_tokens / (time.time() - window_start)
                window_tokens, window_start = 0, time.time()
                expected = {"step": f"{step}/~{schedule.expected:.0f}"} if schedule.budget else {}
                progress.set_postfix(**expected, loss=f"{entry['loss']:.3f}", lr=f"{learning_rate:.2e}",
                                     tok_s=f"{tokens_per_second:.0f}", refresh=False)  # shown at the bar's pace
                accelerator.log({"train/loss": entry["loss"], "train/learning_rate": learning_rate,
                                 "train/target_tokens_per_second": tokens_per_second}, step=step)
                if run.train_step.compilations() != compiled:
                    compiled = run.train_step.compilations()
                    if accelerator.is_local_main_process:
                        progress.write(f"step {step}: torch.compile has compiled {compiled} graph(s) so far")

            previous, last_check = last_check, run.seconds()
            if schedule.evaluate(step, previous, last_check):
                read(unread)
                validate(step, entry)
                run.start_time += run.seconds() - last_check  # the run's clock counts training, not validation
            if saved := schedule.save(step, previous, last_check):
                read(unread)
                schedule.saved(last_check)  # in the state the checkpoint keeps
                run.save(step, last_check)
            if sigterm.requested(accelerator):
                read(unread)
                if not saved:
                    run.save(step, last_check, on_sigterm=True)
                break
    read(unread)
    if not ended:  # SIGTERM: saved, stopped
        if accelerator.is_main_process:
            print(f"stopped at step {step} (SIGTERM), its checkpoint written: the same command with "
                  "--resume_from_checkpoint latest goes on", file=sys.stderr)
        accelerator.wait_for_everyone()  # said before a launcher, seeing a process end, stops the others
        raise SystemExit(128 + signal.SIGTERM)  # not done: a scheduler starts it again
    accelerator.print(f"{ended} reached at step {step}")
    return step


def publish(final, tokenizer, output_dir: Path, metrics: dict, pairs: dict, alpha: float, data_args, model_args,
            args, say) -> None:
    """The Hub-ready output folder (training/hub.py: weights, code, tokenizer, metrics, the model card with the
    recipe and its deviations from the paper), pushed with --push_to_hub; `alpha`: the GNMT α chosen."""
    args = replace(args, length_penalty_alpha=alpha)  # the α the run chose, in a copy of the flags
    recipe = {**({} if args.model_name_or_path else asdict(model_args)),  # a start's: named as the base model
              **{k: v for k, v in asdict(args).items() if k not in NOT_RECIPE},
              "max_tokens": metrics["max_tokens"],  # --max_tokens 0: the batch the run chose
              "mixed_precision": metrics["distributed"]["mixed_precision"]}  # auto: the precision it trained in
    write_output_folder(
        final, tokenizer, output_dir, metrics, data=training_data(data_args, pairs),
        length_limit=f"trained on pairs of at most {data_args.max_length} tokens a side (longer ones were left out)",
        source_lang=data_args.source_lang, target_lang=data_args.target_lang,
        model_id=args.hub_model_id or output_dir.name, recipe=recipe,
        deviations=recipe_deviations(args, data_args), label_smoothing=args.label_smoothing,
        batching=f"batches grouped by length and counted in tokens, {args.tokens_per_step} per step",
        num_beams=args.num_beams, alpha=alpha, base_model=args.model_name_or_path, trees=args.evalb,
    )
    say(f"model, tokenizer, metrics and model card in {output_dir}")
    if args.push_to_hub:
        from vaswani_hf.tools.hub import push_or_exit

        say(f"pushed to {push_or_exit(output_dir, args.hub_model_id or output_dir.name, args.hub_private_repo)}")


def start_processes(args) -> tuple[Accelerator, dict]:
    """This process's Accelerator (mixed precision by --mixed_precision; FSDP checked on import), how the run is
    spread over processes (printed first), the cores shared among the processes, and the seed."""
    use_gpu = on_gpu()
    mixed_precision = chosen_precision(args.mixed_precision, use_gpu)
    accelerator = Accelerator(cpu=not use_gpu, mixed_precision=mixed_precision, project_dir=args.output_dir,
                              log_with=None if args.report_to == ["none"] else args.report_to,
                              dynamo_backend="no")  # the step compiles: step.py
    distributed = {**describe(accelerator), "device": accelerator.device.type, "mixed_precision": mixed_precision}
    accelerator.print("distributed: " + ", ".join(f"{key} {value}" for key, value in distributed.items()))
    if mixed_precision == "bf16" and not use_gpu and slow_bfloat16():
        accelerator.print("warning: --mixed_precision bf16 on a CPU without bfloat16 instructions is slower than "
                          "float32 (10x a step on an AMD EPYC, family 23): --mixed_precision no trains in float32")
    if not use_gpu:  # share the cores this process may use among the processes; keep freed memory (allocator.py)
        share_cores(accelerator.num_processes)
        keep_freed_memory()
    if args.deterministic:
        deterministic_kernels()
    set_seed(args.seed)
    return accelerator, distributed


def open_output_dir(accelerator, output_dir: Path, args, model: dict, streaming: bool) -> Path | None:
    """Every process calls this. The checkpoint to resume from (`check_output_dir`), of a run with as many processes
    and as `streaming`, its abandoned successors moved aside; or None, the folder emptied first with
    --overwrite_output_dir."""
    resumed = check_output_dir(output_dir, args, model, accelerator.print)  # every process reads
    if resumed and (was := "stream" in json.loads((resumed / STATE_FILE).read_text(encoding="utf-8"))) != streaming:
        # a streamed run's place is in each process's stream, an epoch run's in its step
        raise SystemExit(f"error: {resumed} was streamed: resume it with --streaming" if was else
                         f"error: {resumed} was not streamed: resume it without --streaming")
    if resumed and (written := len(list(resumed.glob("rng_state_*.safetensors")))) != accelerator.num_processes:
        # each process's generators are in it, and the step's batches are shared among the processes
        raise SystemExit(f"error: {resumed} was written by {written} process{'es' * (written > 1)}, this launch has "
                         f"{accelerator.num_processes}: resume it with {written} (accelerate launch --num_processes "
                         f"{written})")
    accelerator.wait_for_everyone()  # before anyone writes there
    if accelerator.is_main_process and resumed:
        for path in leave_timeline(resumed):
            accelerator.print(f"{path.name}: after {resumed.name}, so no longer part of this run")
    elif accelerator.is_main_process and args.overwrite_output_dir:
        shutil.rmtree(output_dir, ignore_errors=True)
    return resumed


def run_data(accelerator, data_args, vocab_size: int, args, output_dir: Path, resumed: Path | None,
             start_tokenizer=None):
    """The run's data splits and its joint BPE (§5.1), trained once by the main process, or a fine-tuned model's
    `start_tokenizer` (a resumed run's is in --output_dir), read by every process."""
    with accelerator.main_process_first():  # Arrow in datasets' cache: written once, then memory-mapped by all
        data = load_run_data(data_args)
    with said_once():  # every process reads the same targets
        check_trees(data, args.evalb)
    if accelerator.is_main_process and not resumed:
        if start_tokenizer is None:
            start_tokenizer = train_joint_bpe(corpus_texts(data["train"], data_args.bpe_sample, args.seed), vocab_size)
        save_tokenizer(start_tokenizer, output_dir)  # as the model folder saves it: the pairs' tokens' stamp holds
    accelerator.wait_for_everyone()
    return data, AutoTokenizer.from_pretrained(output_dir)


def fine_tuning_start(start: str, model_args, max_length: int, args):
    """(config, tokenizer, generation config) of the model that --model_name_or_path names, before any work: a
    vaswani_hf model whose positions reach --max_length and whose weights fit it, with the dropouts the flags give.
    One that decodes as it was published (a converted model) is not given the paper's α."""
    config, tokenizer = checked(start)
    config.update(model_args.dropouts())
    generation = start_decoding(start, config, ["alpha_candidates"] * bool(args.alpha_candidates) + search_flags(args))
    if learned_positions(config) and max_length > config.max_position_embeddings:
        raise SystemExit(f"error: --max_length {max_length}: the learned positions of {start} stop at "
                         f"{config.max_position_embeddings}")
    loaded_whole(VaswaniForConditionalGeneration, start)  # weights that do not fit: refused before the data is read
    return config, tokenizer, generation


def run_schedule(run: Run, p_drop: float, validates: bool, budget: TimeBudget | None, replay: dict | None) -> Steps:
    """The schedule of the run's mode (training/schedules.py): replayed, budgeted or the paper's steps."""
    epoch = getattr(run.batches, "steps_per_epoch", None)  # --streaming: not known (and --dropout_epochs refused)
    given = (run.args, run.state, epoch, p_drop, validates)
    return Replayed(*given, budget, replay) if replay else Budgeted(*given, budget) if budget else Steps(*given)


def training_batches(accelerator, model, train, data_args, tokenizer, max_tokens: int, args, output_dir: Path,
                     distributed: dict) -> EpochBatches | StreamedBatches:
    """§5.1 batching, `accumulation` batches of this process and of every other per optimizer step: from the tokens
    cached on disk (training/batching.py, training/tokens.py), or read as training goes (--streaming). Says what
    the run trains on."""
    say, world, rank = accelerator.print, accelerator.num_processes, accelerator.process_index
    accumulation = max(1, math.ceil(args.tokens_per_step / (max_tokens * world)))
    if data_args.streaming:
        batches = StreamedBatches(train, pair_encoder(tokenizer), rank, world, max_tokens, data_args.max_length,
                                  data_args.shuffle_buffer, args.seed, accumulation)
        corpus = f"training pairs streamed (each process its own part, batched {data_args.shuffle_buffer:,} at a time)"
    else:
        train = token_dataset(accelerator, train, tokenizer, output_dir, say)  # memory-mapped
        try:
            batches = EpochBatches(train, data_args.max_length, max_tokens, args.seed, accumulation, rank, world)
        except ValueError as error:
            raise SystemExit(f"error: {error}") from None
        if batches.skipped:
            say(f"--max_length {data_args.max_length}: {batches.skipped:,} of {len(train):,} training pairs are "
                "longer (in tokens) and skipped")
        corpus = f"{batches.pairs:,} training pairs (padding {batches.padding:.1%})"
    say(f"{corpus}, vocabulary {len(tokenizer):,}, {accelerator.unwrap_model(model).num_parameters() / 1e6:.1f}M "
        f"parameters ({distributed['parameters_held_by_the_main_process']:,} held by the main process), {world} "
        f"process(es), {accumulation} accumulated batch(es) of <= {max_tokens:,} tokens per step")
    return batches


def time_budget(args, d_model: int) -> TimeBudget | None:
    """The run's time budget (training/budget.py) with --max_train_minutes, its peak the §5.3 curve's."""
    if args.max_train_minutes is None:
        return None
    peak = inverse_sqrt_lr(args.warmup_steps, d_model, args.warmup_steps, args.lr_scale)
    return TimeBudget(60 * args.max_train_minutes, args.max_steps, peak, args.warmup_steps, args.warmup_share,
                      args.cooldown_share, args.average_share, args.average_checkpoints, args.evaluations)


def batch_tokens(accelerator, model, resumed: Path | None, args, max_length: int) -> int:
    """The most padded tokens of a batch (--max_tokens): the flag's; with 0, a resumed run's own, else on a GPU the
    largest that fits its memory (training/step.py), on a CPU 4,096."""
    if args.max_tokens:
        return args.max_tokens
    if resumed and "max_tokens" in (saved := json.loads((resumed / STATE_FILE).read_text(encoding="utf-8"))):
        return saved["max_tokens"]
    if accelerator.device.type != "cuda":
        return 4096
    tokens = largest_batch(accelerator, model, args.tokens_per_step, max_length, args.cudnn_attention)
    accelerator.print(f"--max_tokens 0: batches of up to {tokens} tokens fit this GPU's memory")
    return tokens


def run_plan(accelerator, config, resumed: Path | None) -> dict:
    """fast_cpu's plan for the whole run, the same on every process: a resumed run's own (its checkpoints keep it),
    else the one kept for this machine and the model's sizes, measured by the main process the first time."""
    if resumed and "fast_cpu_plan" in (saved := json.loads((resumed / STATE_FILE).read_text(encoding="utf-8"))):
        return saved["fast_cpu_plan"]
    plan = None
    if accelerator.is_main_process:
        with torch.random.fork_rng(devices=[]):  # the probe model's initial weights are not the run's draws
            plan = fast_cpu(VaswaniForConditionalGeneration(config)).fast_cpu_plan
    return broadcast_object_list([plan])[0]


# What a run writes in --output_dir: checkpoints and what a killed or resumed run leaves of them, the tokens,
# TensorBoard's logs, the model folder. --overwrite_output_dir deletes a folder that holds nothing else.
RUN_ENTRY = re.compile(r"(\.incomplete-|abandoned-)?checkpoint-\d+|tokens(\.partial)?|vaswani|README\.md"
                       r"|source\.spm|target\.spm|(target_)?vocab\.json|vocab-(src|tgt)\.json|merges\.txt"  # converted
                       r"|(config|generation_config|metrics|schedule|tokenizer|tokenizer_config|special_tokens_map)\.json"
                       r"|model(-\d+-of-\d+)?\.safetensors|model\.safetensors\.index\.json"
                       r"|(checks|configuration_vaswani|gnmt|modeling_vaswani|pipeline_vaswani)\.py")


def check_output_dir(output_dir: Path, args, model: dict, say) -> Path | None:
    """The checkpoint to resume from, intact and of this model; or None for a fresh run, whose folder must be new or
    empty unless --overwrite_output_dir, which deletes only what a run writes. Only reads: a refused run has changed
    nothing."""
    check_output_place(args.output_dir, "--output_dir")
    if not args.resume_from_checkpoint:
        held = sorted(path.name for path in output_dir.iterdir()) if output_dir.is_dir() else []
        if foreign := [name for name in held if not RUN_ENTRY.fullmatch(name)]:
            raise SystemExit(f"error: --output_dir {output_dir} holds {foreign[0]}, which no run writes: choose "
                             "another folder (--overwrite_output_dir deletes only a run's)")
        if held and not args.overwrite_output_dir:
            if checkpoints(output_dir):
                what = "is not empty: resume its run with --resume_from_checkpoint latest, replace it"
            else:
                what = "is not empty and holds no checkpoint to resume: replace it"
            raise SystemExit(f"error: --output_dir {output_dir} {what} with --overwrite_output_dir, or choose another "
                             "folder")
        return None
    if args.overwrite_output_dir:
        raise SystemExit(
            "error: --overwrite_output_dir deletes the run that --resume_from_checkpoint resumes: give one"
        )
    try:
        path = resolve_checkpoint(output_dir, args.resume_from_checkpoint, say)
    except FileNotFoundError as error:
        raise SystemExit(f"error: {error}") from None
    if path.resolve().parent != output_dir.resolve():
        raise SystemExit(f"error: --resume_from_checkpoint {path} is not a checkpoint of --output_dir {output_dir}")
    needed = "tokenizer.json" if (path / "tokenizer.json").is_file() else "tokenizer_config.json"  # a converted one's
    if not (output_dir / needed).is_file():
        raise SystemExit(
            f"error: --output_dir {output_dir} has no {needed}: the run's tokenizer is needed to resume it"
        )
    saved = json.loads((path / STATE_FILE).read_text(encoding="utf-8")).get("model", model)
    if (was := saved.get("model_name_or_path")) != model.get("model_name_or_path"):
        raise SystemExit(f"error: {path} " + (f"fine-tunes {was}: resume with --model_name_or_path {was}" if was else
                                              "trains a new model: resume without --model_name_or_path"))
    changed = [f"--{k} {model[k]} (the checkpoint's: {saved.get(k)})" for k in model if saved.get(k) != model[k]]
    if changed:
        raise SystemExit(f"error: {path} holds another model: {', '.join(changed)}")
    return path


if __name__ == "__main__":
    main()
