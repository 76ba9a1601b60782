"""Train the same model with transformers' Seq2SeqTrainer, for users who prefer the Trainer to training/run.py.

    python training/run_trainer.py --preset cpu-small --output_dir outputs/trainer        # embedded EN-DE data
    python training/run_trainer.py --train_file ../shared/data/multi30k/train \\
        --validation_file ../shared/data/multi30k/valid --test_file ../shared/data/multi30k/test2016 \\
        --vocab_size 8000 --d_model 256 --d_ff 1024 --num_heads 4 --num_layers 3 --max_steps 2000
    accelerate launch --multi_gpu training/run_trainer.py ...   # the Trainer distributes itself (DDP; CPUs too)
    python training/run_trainer.py ... --resume_from_checkpoint latest   # a stopped run, from its newest checkpoint
    python training/run_trainer.py --model_name_or_path outputs/run --train_file ... --learning_rate 1e-4 \
        --warmup_steps 100 --max_steps 1000           # fine-tune a trained or converted model on other data

Data and model flags are those of training/run.py (and `--preset` reads the same recipe files, for the keys that
exist here), but for `--streaming`, `--shuffle_buffer` and `--max_length` (refused: RUN_PY_ONLY); every other flag
is a `Seq2SeqTrainingArguments` one. Their defaults here are the paper's (§5.3, §5.4): Adam(0.9, 0.98, 1e-9), no
weight decay, no clipping, linear warmup over 4000 steps then inverse square root decay with the peak learning rate
lr_scale · d_model^-0.5 · warmup^-0.5, label smoothing 0.1, evaluation and test decoding with beam 4.

Differences from training/run.py, by the Trainer's design: batches are counted in sentences
(`per_device_train_batch_size`), not tokens; the Trainer's label smoothing gives every token ε/V (the paper: the
gold token 1 - ε, the others ε/(V-1)); no checkpoint averaging; the checkpoints are the Trainer's, kept as data
alone as run.py's (training/trainer_checkpoints.py: no `torch.save` pickle); no FSDP (refused: run.py shards), no
DeepSpeed (refused: its checkpoints are pickles). The validation BLEU (`predict_with_generate`; without it, the
validation loss alone), the test set, the checkpoints and the saved folder decode the paper's way (in
generation_config.json: beam 4, GNMT length penalty α 0.6, outputs up to source length + 50, unless
`--generation_num_beams`, `--length_penalty_alpha`, `--extra_length` or a preset say otherwise), as in run.py.
With `--evalb` (the parsing preset's), linearized trees are scored with EVALB's bracketing F1 as well.

`--model_name_or_path` fine-tunes a vaswani_hf model folder or Hub repository instead of training a new model: its
weights, architecture and tokenizer (the size flags, a preset and --bpe_sample, which describe a new model, are refused
with it; --dropout and the other two set the recipe's, §5.4, over its own); the model card names it as the start. A
model that decodes the paper's way (run.py's, this run's) keeps doing so; a converted one keeps the decoding it was
published with (OPUS-MT's: transformers' beam search), with `--generation_num_beams` beams.
"""

import signal
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from transformers import (
    AutoTokenizer,
    DataCollatorForSeq2Seq,
    HfArgumentParser,
    Seq2SeqTrainingArguments,
    set_seed,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from training.arguments import (
    DROPOUTS,
    DataArguments,
    ModelArguments,
    check_model_arguments,
    parse_flags,
    parsed_dataclasses,
    read_preset,
    refuse_below,
    refuse_blank,
    refuse_new_model_flags,
    refuse_seed_or_smoothing,
    refuse_unless_alpha,
    refuse_unless_positive,
)
from training.checkpoints import SigtermCheckpoint, leave_timeline, stopped_in_one_line, writing
from training.data import as_pairs, load_run_data
from training.distributed import share_cores
from training.evaluation import check_trees, reported, score, translate
from training.fsdp_request import deepspeed_requested, fsdp_requested, refuse, said_once
from training.hub import set_run_decoding, start_decoding, write_output_folder
from training.recipe import changed_values, search_flags, training_data
from training.step import Diverged, slow_bfloat16, training_config
from training.tokenizer import corpus_texts, train_joint_bpe
from training.trainer_checkpoints import (
    DataCheckpointTrainer,
    FiniteWeights,
    SigtermStop,
    TrainingClock,
    check_resumed_model,
    resume_point,
)
from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_hf.tools.export import check_output_place
from vaswani_hf.tools.hub import check_can_push, push_or_exit
from vaswani_hf.tools.loading import checked, loaded_whole, one_line_errors
from vaswani_hf.tools.text import utf8_output

PAPER_TRAINER_DEFAULTS = {
    "adam_beta1": 0.9, "adam_beta2": 0.98, "adam_epsilon": 1e-9, "weight_decay": 0.0, "max_grad_norm": 0.0,
    "lr_scheduler_type": "inverse_sqrt", "warmup_steps": 4000, "label_smoothing_factor": 0.1,
    "predict_with_generate": True, "generation_num_beams": 4, "eval_strategy": "steps", "eval_steps": 1000,
    "save_steps": 1000, "logging_steps": 50, "per_device_train_batch_size": 64, "per_device_eval_batch_size": 64,
    "report_to": "none", "output_dir": "outputs/trainer", "ddp_find_unused_parameters": False,
}
PAPER_OPTIMIZER = ("adam_beta1", "adam_beta2", "adam_epsilon", "weight_decay", "lr_scheduler_type")
ADAM = ("adamw_torch", "adamw_torch_fused")  # without weight decay: Adam (§5.3)
# training/run.py's data flags that this run does not honour, and why.
RUN_PY_ONLY = {
    "--streaming": "here the Trainer's datasets hold the training pairs in memory",
    "--shuffle_buffer": "it orders a --streaming run",
    "--max_length": "it skips longer pairs; here pairs are truncated to --max_source_length",
}
# The Trainer's Hub flags that this run, which pushes the finished model's files once at its end, would not honour.
HUB_FLAGS = {
    "--hub_strategy": "the run pushes its finished model's files once, at its end (end)",
    "--hub_always_push": "the run pushes its finished model's files once, at its end",
    "--hub_revision": "the run pushes to the repository's main branch",
    "--hub_token": "the token is huggingface_hub's own: set HF_TOKEN, or hf auth login",
}
# Recipe-file keys and their Trainer names.
PRESET_KEYS = {"warmup_steps": "warmup_steps", "eval_steps": "eval_steps", "seed": "seed", "max_steps": "max_steps",
               "max_grad_norm": "max_grad_norm", "num_beams": "generation_num_beams",
               "length_penalty_alpha": "length_penalty_alpha", "extra_length": "extra_length", "evalb": "evalb"}


@dataclass
class TrainerRecipeArguments:
    preset: str | None = field(default=None, metadata={"help": "A recipe file in training/presets (model keys)."})
    lr_scale: float = field(default=1.0, metadata={
        "help": "Peak learning rate = lr_scale · d_model^-0.5 · warmup^-0.5 unless --learning_rate is given."})
    max_source_length: int = field(default=256, metadata={"help": "Sources and targets are truncated to this."})
    length_penalty_alpha: float = field(default=0.6, metadata={"help": "GNMT α (§6.1) of the run's decoding."})
    extra_length: int = field(default=50, metadata={
        "help": "Tokens an output may run past its source's length (§6.1; §6.3's parser: 300)."})
    evalb: bool = field(default=False, metadata={
        "help": "The targets are linearized constituency trees (training/treebank.py's): score them with EVALB's "
                "bracketing F1 as well (§6.3's parser; the parsing preset sets it)."})
    model_name_or_path: str | None = field(default=None, metadata={
        "help": "Fine-tune this vaswani_hf model (a folder or Hub id) instead of training a new one: its weights, "
        "architecture and tokenizer."})


def parse_arguments(argv: list[str] | None = None):
    argv = sys.argv[1:] if argv is None else argv
    if deepspeed_requested() or "--deepspeed" in {arg.split("=")[0] for arg in argv}:  # before the Trainer looks
        refuse("error: training/run_trainer.py does not run DeepSpeed, whose checkpoints are pickles: train with DDP "
               "(accelerate launch --multi_gpu), or shard with training/run.py (FSDP2)")
    parser = HfArgumentParser((DataArguments, ModelArguments, TrainerRecipeArguments, Seq2SeqTrainingArguments))
    # Without CUDA the run is on the CPU, as training/run.py's: the Trainer asked alone would run each of several
    # launched processes on its own (Accelerate forms a CPU process group only when asked for the CPU), and pin
    # memory for no device (torch's DataLoader warns of it at each evaluation).
    parser.set_defaults(**PAPER_TRAINER_DEFAULTS, use_cpu=not torch.cuda.is_available())
    first = parsed_dataclasses(parser, argv)[2]
    if first.model_name_or_path is not None:
        parser.set_defaults(**dict.fromkeys(DROPOUTS))  # not given: the start's
    values = read_preset(first.preset) if first.preset else {}
    model_keys = {f for f in ModelArguments.__dataclass_fields__} | {"lr_scale"}
    parser.set_defaults(**{k: v for k, v in values.items() if k in model_keys},
                        **{PRESET_KEYS[k]: v for k, v in values.items() if k in PRESET_KEYS})
    if fsdp_requested():  # asked by `accelerate launch`: refused before the Trainer's arguments join the processes
        refuse_fsdp()
    data_args, model_args, recipe, training_args = parse_flags(parser, argv, "training/run_trainer.py")
    if (left_out := sorted(values.keys() - model_keys - PRESET_KEYS.keys())) and training_args.process_index == 0:
        print(f"note: --preset {first.preset}: {', '.join(left_out)}: training/run.py's recipe, not the Trainer's; "
              "this run leaves them out")
    if training_args.fsdp_plugin_args is not None:  # asked by the Trainer's --fsdp
        refuse_fsdp()
    # the Trainer's precision: --bf16 or --fp16, else what accelerate launch --mixed_precision names
    if training_args.mixed_precision == "fp16" and training_args.device.type == "cpu":  # Accelerate: float32 there
        asked = "--fp16" if training_args.fp16 else "accelerate launch --mixed_precision fp16"
        raise SystemExit(f"error: {asked} needs a GPU (float16 autocast is not run on the CPU): leave it out "
                         "(float32) or use --bf16 true")
    given = {arg.split("=")[0] for arg in argv}
    for flag in sorted(RUN_PY_ONLY.keys() & given):
        raise SystemExit(f"error: {flag} is training/run.py's ({RUN_PY_ONLY[flag]})")
    for flag in sorted(HUB_FLAGS.keys() & given):
        if not (flag == "--hub_strategy" and training_args.hub_strategy == "end"):
            raise SystemExit(f"error: {flag}: {HUB_FLAGS[flag]}")
    if training_args.generation_config is not None:  # the Trainer would put it in place of the run's decoding
        raise SystemExit("error: --generation_config: the run decodes (and saves in its generation_config.json) as "
                         "--generation_num_beams, --length_penalty_alpha and --extra_length say")
    # transformers' example scripts' flags, asking for less than this script does: no --do_train, or it false
    asked = [flag for flag in ("--do_train", "--do_eval", "--do_predict") if flag in given]
    if asked and not training_args.do_train:
        named = ", ".join(f"{flag} false" if flag == "--do_train" else flag for flag in asked)
        raise SystemExit(f"error: {named}: training/run_trainer.py always trains, then tests: to score a model, "
                         "translate with vaswani-translate, then training/score.py")
    check_model_arguments(data_args, model_args)  # our flags, before any work, as run.py checks them
    d_model = model_args.d_model
    refuse_below({"max_source_length": (recipe.max_source_length, 1), "extra_length": (recipe.extra_length, 0),
                  "generation_num_beams": (training_args.generation_num_beams, 1),
                  # the Trainer's own, which it takes and fails on later (a traceback, after training for the last)
                  "per_device_train_batch_size": (training_args.per_device_train_batch_size, 1),
                  "per_device_eval_batch_size": (training_args.per_device_eval_batch_size, 1),
                  "gradient_accumulation_steps": (training_args.gradient_accumulation_steps, 1),
                  "generation_max_length": (training_args.generation_max_length or 2, 2)})  # start token + 1
    steps = {"logging_steps": training_args.logging_strategy, "eval_steps": training_args.eval_strategy,
             "save_steps": training_args.save_strategy}  # (below 1: a share of the run's steps)
    refuse_unless_positive({name: getattr(training_args, name) for name, every in steps.items() if every == "steps"})
    refuse_unless_alpha(recipe.length_penalty_alpha)
    refuse_seed_or_smoothing(training_args.seed, "label_smoothing_factor", training_args.label_smoothing_factor)
    if recipe.model_name_or_path is not None:  # fine-tuning: the model's own architecture and tokenizer
        refuse_new_model_flags(argv, recipe.model_name_or_path)
        config = checked(recipe.model_name_or_path)[0]
        start_decoding(recipe.model_name_or_path, config, search_flags(recipe))
        loaded_whole(VaswaniForConditionalGeneration, recipe.model_name_or_path)  # weights that do not fit: refused
        d_model = config.d_model
    refuse_unless_positive({"lr_scale": recipe.lr_scale})
    if "--learning_rate" not in given:  # §5.3 peak
        if not training_args.warmup_steps >= 1:  # the Trainer reads a float below 1 as a share of the steps
            raise SystemExit(f"error: --warmup_steps {training_args.warmup_steps:g}: the §5.3 peak learning rate "
                             "needs at least 1 step (or give --learning_rate)")
        training_args.learning_rate = paper_peak(recipe.lr_scale, d_model, training_args.warmup_steps)
    refuse_unless_positive({"learning_rate": training_args.learning_rate})
    refuse_blank({"resume_from_checkpoint": training_args.resume_from_checkpoint,
                  "hub_model_id": training_args.hub_model_id})
    return data_args, model_args, recipe, training_args


def refuse_fsdp():
    """Accelerate shards nothing on CPUs, and on GPUs its FSDP2 grouping refuses the embedding matrix that three
    modules share (training/distributed.py); the end of this run (test decoding, the folder) is one process's."""
    refuse("error: training/run_trainer.py does not shard with FSDP: shard with training/run.py (the same data and "
           "model flags), or launch without FSDP (DDP)")


def paper_peak(lr_scale: float, d_model: int, warmup_steps: float) -> float:
    """The peak learning rate of §5.3, scaled: lr_scale · d_model^-0.5 · warmup_steps^-0.5."""
    return lr_scale * d_model**-0.5 * warmup_steps**-0.5


def card_deviations(args, recipe, d_model: int, num_beams: int, alpha: float | None) -> list[str]:
    """What this run's recipe changed from the paper's, for the model card (whose recipe line names the paper's): the
    Trainer's batches, label smoothing and final weights, then the values `args` and `recipe` changed — warmup,
    peak learning rate, label smoothing, decoding, and the optimizer, its schedule and clipping (§5.3)."""
    deviations = ["batches counted in sentences, not tokens"]
    if args.label_smoothing_factor:
        deviations.append("the Trainer's label smoothing (ε/V on every token, not ε/(V-1) on the others)")
    deviations.append("no checkpoint averaging")
    warmup = args.warmup_steps if args.warmup_steps % 1 else int(args.warmup_steps)  # a float in transformers 5
    paper = {"warmup_steps": warmup, "label_smoothing": args.label_smoothing_factor,
             "num_beams": num_beams, "length_penalty_alpha": alpha, "extra_length": recipe.extra_length}
    if args.warmup_steps >= 1 and args.learning_rate == paper_peak(recipe.lr_scale, d_model, args.warmup_steps):
        paper["lr_scale"] = recipe.lr_scale
    else:  # --learning_rate given
        deviations.append(f"`learning_rate={args.learning_rate:g}` (paper, §5.3: d_model^-0.5 · warmup_steps^-0.5)")
    deviations += changed_values(paper)
    values = {name: getattr(getattr(args, name), "value", getattr(args, name)) for name in ("optim", *PAPER_OPTIMIZER)}
    if values["optim"] not in ADAM:
        deviations.append(f"`optim={values['optim']}` (paper: Adam)")
    deviations += [f"`{name}={values[name]}` (paper: {PAPER_TRAINER_DEFAULTS[name]})" for name in PAPER_OPTIMIZER
                   if values[name] != PAPER_TRAINER_DEFAULTS[name]]
    if args.max_grad_norm:
        deviations.append(f"gradients clipped to a global L2 norm of {args.max_grad_norm:g} (paper: no clipping)")
    return [f"recipe: {text}" for text in deviations]


def tokenize(tokenizer, pairs: list[tuple[str, str]], max_length: int) -> Dataset:
    sources, targets = zip(*pairs)
    encoded = tokenizer(list(sources), text_target=list(targets), truncation=True, max_length=max_length)
    return Dataset.from_dict({"input_ids": encoded["input_ids"], "attention_mask": encoded["attention_mask"],
                              "labels": encoded["labels"]})


def make_compute_metrics(tokenizer, trees: bool):
    """sacreBLEU and chrF (offline) of generated ids against label ids, and with `trees` EVALB's bracketing F1 (also
    with the skipped sentences missed); -100 (the Trainer's padding of predictions and labels) is read as padding.
    Under the Trainer's `batch_eval_metrics` it is given a batch at a time, and scores the whole set at the last;
    under `eval_do_concat_batches false`, a list of the batches."""
    hypotheses, references = [], []

    def compute_metrics(eval_prediction, compute_result: bool = True) -> dict:
        for given, texts in ((eval_prediction.predictions, hypotheses), (eval_prediction.label_ids, references)):
            for ids in given if isinstance(given, list) else [given]:
                ids = ids.cpu().numpy() if torch.is_tensor(ids) else ids  # batch by batch: the device's tensors
                texts += tokenizer.batch_decode(np.where(ids < 0, tokenizer.pad_token_id, ids),
                                                skip_special_tokens=True)
        if not compute_result:
            return {}
        metrics = score(hypotheses, references, trees)
        hypotheses.clear()
        references.clear()
        kept = ("bleu", "chrf", "bracket_f1", "bracket_f1_all", "skipped")  # the numbers, not the signatures
        return {key: metrics[key] for key in kept if key in metrics}

    return compute_metrics


@stopped_in_one_line(Diverged)  # weights of NaNs, a full disk, Ctrl-C
def main(argv: list[str] | None = None):
    utf8_output()
    with said_once():  # checks that every process makes alike, before any work
        data_args, model_args, recipe, training_args = parse_arguments(argv)
        on_cpu = training_args.device.type == "cpu"
        if training_args.mixed_precision == "bf16" and on_cpu and slow_bfloat16() and training_args.process_index == 0:
            asked = "--bf16" if training_args.bf16 else "accelerate launch --mixed_precision bf16"
            print(f"warning: {asked} on a CPU without bfloat16 instructions is slower than float32 (10x a step on an "
                  "AMD EPYC, family 23): leave it out to train in float32")
        check_output_place(training_args.output_dir, "--output_dir")
        output_dir = Path(training_args.output_dir)
        resumed = resume_point(training_args.resume_from_checkpoint, output_dir,
                               print if training_args.process_index == 0 else lambda line: None)
        if resumed:
            check_resumed_model(resumed, recipe.model_name_or_path, model_args)
        own = resumed is not None and Path(resumed).parent.resolve() == output_dir.resolve()  # a checkpoint of it
        if not own and output_dir.is_dir() and any(output_dir.iterdir()):  # two runs' files would mix
            raise SystemExit(f"error: --output_dir {output_dir} is not empty, and not the folder of {resumed}: resume "
                             "into that folder or an empty one" if resumed else
                             f"error: --output_dir {output_dir} is not empty: resume its run with "
                             "--resume_from_checkpoint latest, or choose another folder")
        # The Trainer itself would upload the output folder at every save (logs, training_args.bin, ...): the run
        # pushes the finished model's files alone, at its end, as training/run.py and vaswani-push do.
        publish, training_args.push_to_hub = training_args.push_to_hub, False
        if publish:
            check_can_push(training_args.hub_model_id or output_dir.name)
    if on_cpu:  # as run.py: all cores the process may use, shared among the launched processes
        share_cores(training_args.world_size)
    training_args.distributed_state.wait_for_everyone()  # every process has looked before the main one writes there
    if own and training_args.process_index == 0:
        for path in leave_timeline(Path(resumed)):  # as run.py: `latest` is this timeline's
            print(f"{path.name}: after {Path(resumed).name}, so no longer part of this run")
    with training_args.main_process_first():  # Arrow in datasets' cache: written once, then memory-mapped by all
        data = load_run_data(data_args)
    with said_once():  # every process reads the same targets; the first, ahead, says it
        check_trees(data, recipe.evalb)
    pairs = {split: as_pairs(rows) for split, rows in data.items()}  # Trainer datasets: lists
    start = recipe.model_name_or_path
    if resumed or start:  # the ids that the checkpoint's or the start's weights learned
        with one_line_errors(resumed or start):
            tokenizer = AutoTokenizer.from_pretrained(resumed or start)
    else:
        with training_args.main_process_first():  # the main process trains the joint BPE, the others read it
            if not (output_dir / "tokenizer.json").is_file():
                texts = corpus_texts(data["train"], data_args.bpe_sample, training_args.seed)  # as run.py's
                train_joint_bpe(texts, model_args.vocab_size).save_pretrained(output_dir)
            tokenizer = AutoTokenizer.from_pretrained(output_dir)
    datasets = {split: tokenize(tokenizer, rows, recipe.max_source_length) for split, rows in pairs.items()}

    precision = training_args.mixed_precision  # under bf16 on a CPU the model trained attends eagerly
    if start is not None:
        with one_line_errors(start):  # the dropouts in its config: from_pretrained's own keyword arguments would
            config = VaswaniConfig.from_pretrained(start, **model_args.dropouts())  # reach its generation config too
            model = VaswaniForConditionalGeneration.from_pretrained(
                start, config=training_config(config, training_args.device, precision))
    else:
        config = model_args.config(tokenizer)
        set_seed(training_args.seed)  # the weights drawn from --seed, as run.py's (the Trainer seeds after they are)
        model = VaswaniForConditionalGeneration(training_config(config, training_args.device, precision))
    num_beams = training_args.generation_num_beams
    alpha = set_run_decoding(model.generation_config, num_beams, recipe.length_penalty_alpha,
                             recipe.extra_length)  # None: a converted model's, as published
    if "validation" not in datasets:
        training_args.eval_strategy = "no"
    jit_checkpoint, training_args.enable_jit_checkpoint = training_args.enable_jit_checkpoint, False  # SigtermStop
    trainer = DataCheckpointTrainer(
        model=model,
        args=training_args,
        train_dataset=datasets["train"],
        eval_dataset=datasets.get("validation"),
        data_collator=DataCollatorForSeq2Seq(tokenizer, model=model),  # decoder inputs from the labels
        processing_class=tokenizer,
        # without predict_with_generate the predictions are logits, not tokens: validation loss alone
        compute_metrics=make_compute_metrics(tokenizer, recipe.evalb) if training_args.predict_with_generate else None,
        callbacks=[clock := TrainingClock.resumed(resumed)],
    )
    with SigtermCheckpoint(jit_checkpoint) as sigterm:
        trainer.add_callback(stop := SigtermStop(sigterm, trainer.accelerator))
        trainer.add_callback(FiniteWeights())  # the last: after the others decide what follows the step
        result = trainer.train(resume_from_checkpoint=resumed)
    if stop.stopped:  # saved
        if trainer.is_world_process_zero():
            print(f"stopped at step {result.global_step} (SIGTERM), its checkpoint written: the same command with "
                  "--resume_from_checkpoint latest goes on", file=sys.stderr)
        trainer.accelerator.wait_for_everyone()  # said before a launcher, seeing a process end, stops the others
        raise SystemExit(128 + signal.SIGTERM)  # not done: a scheduler starts it again
    minutes = clock.elapsed() / 60
    trainer.model.set_attn_implementation(config._attn_implementation)  # tested and saved with the model's own
    metrics = {"train_steps": result.global_step, "train_minutes": minutes}
    if trainer.is_world_process_zero():
        if "test" in pairs:  # the paper's decoding (§6.1), as in run.py
            sources = [s for s, _ in pairs["test"]]
            predictions = translate(trainer.model, tokenizer, sources, num_beams=num_beams)
            metrics["test"] = score(predictions, [t for _, t in pairs["test"]], recipe.evalb, data_args.target_lang)
            print(f"test: {reported(metrics['test'])}  ({metrics['test']['bleu_signature']})")
        deviations = card_deviations(training_args, recipe, config.d_model, num_beams, alpha)
        batch, accumulated = training_args.per_device_train_batch_size, training_args.gradient_accumulation_steps
        with writing(output_dir, "the model"):
            write_output_folder(
                trainer.model, tokenizer, output_dir, metrics, data=training_data(data_args, pairs),
                length_limit=f"trained on pairs truncated to {recipe.max_source_length} tokens on each side",
                source_lang=data_args.source_lang, target_lang=data_args.target_lang,
                model_id=training_args.hub_model_id or output_dir.name,
                recipe={**({} if start else asdict(model_args)), "lr_scale": recipe.lr_scale,  # a start: named above
                        "learning_rate": training_args.learning_rate,
                        "warmup_steps": training_args.warmup_steps, "max_steps": training_args.max_steps,
                        "per_device_train_batch_size": batch, "gradient_accumulation_steps": accumulated,
                        "mixed_precision": precision},
                deviations=deviations, label_smoothing=training_args.label_smoothing_factor,
                batching=f"batches of {batch} sentences per process" + (f", {accumulated} a step" * (accumulated > 1)),
                num_beams=num_beams, alpha=alpha, base_model=start, trees=recipe.evalb,
            )
        if publish:
            url = push_or_exit(output_dir, training_args.hub_model_id or output_dir.name,
                               private=bool(training_args.hub_private_repo))
            print(f"pushed to {url}")


if __name__ == "__main__":
    main()
