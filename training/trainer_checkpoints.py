"""The checkpoints of training/run_trainer.py, the Trainer's, kept as training/run.py keeps its own
(training/checkpoints.py): data alone, no pickle (`DataCheckpointTrainer`); a stopped run resumed from the newest
one that is whole and intact, by its own entry point, with its model, its tokenizer (in the checkpoint) and its
clock (`TrainingClock`)."""

import copy
import json
import re
import time
from dataclasses import asdict
from pathlib import Path

from transformers import Seq2SeqTrainer, TrainerCallback
from transformers.trainer import OPTIMIZER_NAME, SCHEDULER_NAME, TRAINING_ARGS_NAME
from transformers.trainer_callback import ExportableState
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from training.arguments import ModelArguments
from training.checkpoints import (
    OPTIMIZER_FILE,
    SCALER_FILE,
    load_generators,
    load_optimizer,
    load_scaler,
    refuse_other_entry_point,
    save_generators,
    save_optimizer,
    save_scaler,
    writing,
)
from training.step import check_finite_weights
from vaswani_hf.tools.hub import check_readable
from vaswani_hf.tools.loading import checked

SCHEDULER_FILE = "scheduler.json"
RESUMED_FILES = ((OPTIMIZER_FILE, SCHEDULER_FILE), (OPTIMIZER_NAME, SCHEDULER_NAME))  # ours; the plain Trainer's


def resume_point(given: str | None, output_dir: Path, say=print) -> str | None:
    """--resume_from_checkpoint: a checkpoint folder, or `latest` (as run.py takes it): the newest checkpoint-<step>
    in --output_dir that the Trainer finished saving and that is intact (a damaged one: a warning through `say`, and
    the one before it); not run.py's, nor one of the model alone (`--save_only_model`)."""
    if given is None:
        return None
    path = Path(given)
    if given == "latest":
        finished = sorted((path for path in output_dir.glob("checkpoint-*")
                           if re.fullmatch(r"checkpoint-\d+", path.name) and finished_saving(path)),
                          key=lambda path: int(path.name.removeprefix("checkpoint-")))
        for path in reversed(finished):
            if (reason := damage(path)) is None:
                break
            say(f"warning: {path.name} cannot be resumed ({reason}): trying the one before it")
        else:
            raise SystemExit(f"error: --resume_from_checkpoint latest: {output_dir} holds no checkpoint the Trainer "
                             "finished saving" + " intact" * bool(finished))
    elif not finished_saving(path):
        raise SystemExit(f"error: --resume_from_checkpoint {given} is not a checkpoint the Trainer finished saving "
                         "(no whole trainer_state.json): give one, or latest")
    elif reason := damage(path):
        raise SystemExit(f"error: --resume_from_checkpoint {given} cannot be resumed: {reason}")
    try:
        refuse_other_entry_point(given, path, "training/run_trainer.py")
    except FileNotFoundError as error:
        raise SystemExit(f"error: {error}") from None
    if not any(all((path / name).is_file() for name in files) for files in RESUMED_FILES):
        raise SystemExit(f"error: --resume_from_checkpoint {given}: {path} holds no optimizer state and schedule to "
                         "go on with (--save_only_model writes the model alone): fine-tune from it, "
                         f"--model_name_or_path {path}")
    return str(path)


def check_resumed_model(checkpoint: str, start: str | None, model_args: ModelArguments) -> None:
    """The model a resumed run builds (the flags', or its start's with the dropouts given) against the one its
    checkpoint holds (config.json), as run.py checks it: another is one line before any work (the Trainer would stop
    as it loads the weights, after the data, or take other dropouts without a word)."""
    if start is None:
        built = {**asdict(model_args), "num_decoder_layers": model_args.num_decoder_layers or model_args.num_layers}
    else:
        built = {**checked(start)[0].to_dict(), **model_args.dropouts()}
    try:
        saved = json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        raise SystemExit(f"error: --resume_from_checkpoint {checkpoint} has no readable config.json") from None
    compared = dict(saved)
    if start is None:  # heads of d_model / h are what flags without --d_k, --d_v build
        width = saved.get("d_model", 0) / (saved.get("num_heads") or 1)
        compared |= {name: None for name in ("d_k", "d_v") if saved.get(name) == width}
    names = [name for name in ModelArguments.__dataclass_fields__ if name != "vocab_size"]  # the vocabulary: its BPE's
    changed = [f"{name} {built[name]} (the checkpoint's: {saved.get(name)})" for name in names
               if compared.get(name) != built[name]]
    if changed:
        raise SystemExit(f"error: {checkpoint} holds another model: {', '.join(changed)}")


def damage(checkpoint: Path) -> str | None:
    """Which file of the Trainer's `checkpoint` is damaged (a JSON file that does not parse, a safetensors file whose
    header does not read or whose data is cut short: a full disk, a truncated copy), or None."""
    for file in sorted(checkpoint.iterdir()):
        try:
            check_readable(file)
        except ValueError as error:
            return str(error)
    return None


def finished_saving(checkpoint: Path) -> bool:
    """Whether the Trainer finished saving `checkpoint`: trainer_state.json, the last file it writes, is whole (a run
    killed while saving leaves none, or part of one)."""
    try:
        check_readable(checkpoint / "trainer_state.json")
    except ValueError:
        return False
    return True


class SigtermStop(TrainerCallback):
    """--enable_jit_checkpoint under the Trainer: after a step in which any process had a SIGTERM (`sigterm`, a
    training/checkpoints.py SigtermCheckpoint: every process gets the same answer), the Trainer saves that step's
    checkpoint and stops. transformers' own callback waits 3 s, has each process decide alone, and saves before the
    step's update with the random generators past the step's dropout: a run resumed from it made that step again,
    with other dropout masks."""

    def __init__(self, sigterm, accelerator):
        self.sigterm, self.accelerator, self.stopped = sigterm, accelerator, False

    def on_step_end(self, args, state, control, **kwargs):
        if self.sigterm.requested(self.accelerator):
            control.should_save = control.should_training_stop = self.stopped = True


class FiniteWeights(TrainerCallback):
    """A Diverged (one line), before the Trainer logs, evaluates or saves after a step, or ends, if a weight is not
    finite: the Trainer's logged loss leaves a NaN out (`logging_nan_inf_filter`), and a diverged run went on to its
    end, its checkpoints and model of NaNs. (Called after the callbacks that decide what the step is followed by.)"""

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if control.should_log or control.should_evaluate or control.should_save or control.should_training_stop:
            check_finite_weights(model, state.global_step)


class TrainingClock(TrainerCallback, ExportableState):
    """A run's training time over all its sessions, kept in each checkpoint (trainer_state.json): a resumed run's card
    counts the time before its checkpoint too (the Trainer's train_runtime is the last session's)."""

    def __init__(self, seconds: float = 0.0):
        self.seconds, self.started = seconds, time.time()

    @classmethod
    def resumed(cls, checkpoint: str | None) -> "TrainingClock":
        """The clock a run resumed from `checkpoint` goes on with (none: a new run's, or an older checkpoint's)."""
        kept = json.loads((Path(checkpoint) / "trainer_state.json").read_text(encoding="utf-8")) if checkpoint else {}
        return cls(**kept.get("stateful_callbacks", {}).get(cls.__name__, {}).get("args", {}))

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.time()

    def elapsed(self) -> float:
        return self.seconds + time.time() - self.started

    def state(self) -> dict:
        return {"args": {"seconds": self.elapsed()}, "attributes": {}}


class DataCheckpointTrainer(Seq2SeqTrainer):
    """A Seq2SeqTrainer whose checkpoints hold data alone, as training/run.py's (training/checkpoints.py): Adam's state
    and the random generators as safetensors, the schedule, the gradient scaler and the arguments as JSON, where the
    Trainer's are `torch.save` pickles. A checkpoint the plain Trainer wrote still resumes, read as the Trainer reads
    it (`weights_only=True`)."""

    def prediction_step(self, *args, **kwargs):
        """Seq2SeqTrainer's, which fills the model's generation config with every default of transformers' own
        (`max_length` 20, `top_k` 50, ...: saved with each checkpoint and the model): the run's decoding kept."""
        decoding = copy.deepcopy(self.model.generation_config)
        try:
            return super().prediction_step(*args, **kwargs)
        finally:
            self.model.generation_config = decoding

    def _run_epoch(self, *args, **kwargs) -> None:
        """The Trainer's, which takes a step before it looks at max_steps: resumed from the checkpoint of its last step
        (a run stopped while testing or writing its model), it would train one step more than the run never stopped."""
        if self.state.global_step >= self.state.max_steps:
            self.control.should_training_stop = True
            return
        super()._run_epoch(*args, **kwargs)

    def _save_checkpoint(self, model, trial) -> None:
        """The Trainer's, which writes checkpoint-<step> in place: a write the disk refuses removes what it wrote (the
        room it took) and is a WriteRefused naming the newest intact checkpoint (training/checkpoints.py)."""
        run_dir = Path(self._get_output_dir(trial=trial))
        partial = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
        with writing(run_dir, partial.name, partial if self.args.should_save else None):
            super()._save_checkpoint(model, trial)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        super()._save(output_dir, state_dict)
        if self.args.should_save:  # the arguments, which the Trainer never reads back
            folder = Path(output_dir or self.args.output_dir)
            (folder / "training_args.json").write_text(self.args.to_json_string(), encoding="utf-8")
            (folder / TRAINING_ARGS_NAME).unlink()

    def _save_optimizer_and_scheduler(self, output_dir: str) -> None:
        save_optimizer(self.model, self.optimizer, Path(output_dir) / OPTIMIZER_FILE, self.args.should_save)
        if self.args.should_save:
            schedule = json.dumps(self.lr_scheduler.state_dict())
            (Path(output_dir) / SCHEDULER_FILE).write_text(schedule, encoding="utf-8")

    def _save_scaler(self, output_dir: str) -> None:
        if self.args.should_save:
            save_scaler(self.accelerator.scaler, Path(output_dir))

    def _save_rng_state(self, output_dir: str) -> None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)  # this process may be ahead of the main one
        save_generators(Path(output_dir) / f"rng_state_{self.args.process_index}.safetensors")

    def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
        if checkpoint is None or not (Path(checkpoint) / OPTIMIZER_FILE).is_file():
            return super()._load_optimizer_and_scheduler(checkpoint)  # nothing, or the plain Trainer's pickles
        load_optimizer(self.model, self.optimizer, Path(checkpoint) / OPTIMIZER_FILE)
        self.lr_scheduler.load_state_dict(json.loads((Path(checkpoint) / SCHEDULER_FILE).read_text(encoding="utf-8")))

    def _load_scaler(self, checkpoint: str | None) -> None:
        if checkpoint is None or not (Path(checkpoint) / SCALER_FILE).is_file():
            return super()._load_scaler(checkpoint)
        load_scaler(self.accelerator.scaler, Path(checkpoint))

    def _load_rng_state(self, checkpoint: str | None) -> None:
        file = f"rng_state_{self.args.process_index}.safetensors"
        if checkpoint is None or not (Path(checkpoint) / file).is_file():
            return super()._load_rng_state(checkpoint)
        load_generators(Path(checkpoint) / file)

    def _issue_warnings_after_load(self, load_result) -> None:
        """The embedding's tied copies are in no checkpoint, by design: not missing (transformers #27972)."""
        tied = getattr(self.model, "all_tied_weights_keys", None) or {}
        super()._issue_warnings_after_load(
            load_result._replace(missing_keys=[key for key in load_result.missing_keys if key not in tied]))
