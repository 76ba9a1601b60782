"""The tests' shared helpers and fixtures: tiny models with characteristic dimensions, so that shape mix-ups fail
loudly; a trained model and a run's output folder built once per run; our commands run in the test process; a fresh
Python without vaswani_hf for the remote-code tests. conftest.py loads this module as a plugin in every process that
runs tests (`from support import ...` in the tests)."""

import contextlib
import functools
import io
import math
import os
import signal
import subprocess
import sys
import textwrap

import psutil
import pytest
import torch
from filelock import FileLock
from safetensors.torch import load_model, save_model

from vaswani_hf import VaswaniConfig, VaswaniForConditionalGeneration

PAD, BOS, EOS = 0, 1, 2
# The code a saved model carries (save_pretrained copies the modeling file and what it imports).
CODE_FILES = {"configuration_vaswani.py", "modeling_vaswani.py", "checks.py", "gnmt.py"}
LENGTH_LIMIT = "trained on pairs of at most 256 tokens a side (longer ones were left out)"  # as run.py words it


@pytest.fixture(autouse=True)
def dynamo_as_in_a_new_process():
    """Every test compiles from dynamo's state of a new process. Left as an earlier test left it, dynamo treats the
    shapes that changed since that test's compile as dynamic (automatic dynamic shapes): test_model's fullgraph
    compile, traced symbolically after the GPU check's compiles, took 25 s where it takes 7."""
    yield
    if "torch._dynamo" in sys.modules:
        torch._dynamo.reset()


@pytest.fixture(autouse=True)
def torch_threads_kept():
    """Every test leaves torch's thread count as it found it. A library that resets it (CTranslate2's Translator
    does: test_export.py) would put two threads on a pinned worker's one core and slow every later test of that
    worker many times over, without failing any."""
    threads = torch.get_num_threads()
    yield
    now = torch.get_num_threads()
    assert now == threads, f"torch's thread count changed from {threads} to {now}"


def tiny_config(**overrides) -> VaswaniConfig:
    """d_model 24, 3 heads of 8, d_ff 36, 2 encoder and 3 decoder layers, vocabulary 53, no dropout."""
    values = {"vocab_size": 53, "d_model": 24, "d_ff": 36, "num_heads": 3, "num_layers": 2, "num_decoder_layers": 3,
              "dropout": 0.0}
    values.update(overrides)
    return VaswaniConfig(**values)


def tiny_model(seed: int = 0, authors_init: bool = False, **overrides) -> VaswaniForConditionalGeneration:
    """A tiny model of random weights, its biases and LayerNorms drawn at random too (`draw_gains_and_biases`), or,
    with `authors_init`, as the authors' initialization leaves them (0 and 1)."""
    torch.manual_seed(seed)
    model = VaswaniForConditionalGeneration(tiny_config(**overrides)).eval()
    return model if authors_init else draw_gains_and_biases(model)


def draw_gains_and_biases(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its linear layers' biases and its LayerNorms' gains and biases drawn at random, as a trained
    model's are (initializations set them to 0 and 1): a LayerNorm in another's place, or a bias dropped or swapped,
    then changes what the model computes."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (torch.nn.Linear, torch.nn.LayerNorm)) and module.bias is not None:
                module.bias.normal_(0.0, 0.3)
            if isinstance(module, torch.nn.LayerNorm):
                module.weight.normal_(1.0, 0.3)
    return model


def summed_nll(model, tokenizer, pairs) -> tuple[float, int]:
    """The model's cross-entropy summed over the target tokens of (source, target) `pairs`, one sentence at a time
    (no padding to leave out), and the number of those tokens: the reference for the NLLs the benchmarks report."""
    total = tokens = 0
    with torch.no_grad():
        for source, target in pairs:
            labels = torch.tensor([tokenizer(text_target=target)["input_ids"]])
            logits = model(input_ids=torch.tensor([tokenizer(source)["input_ids"]]), labels=labels).logits
            total += torch.nn.functional.cross_entropy(logits[0], labels[0], reduction="sum").item()
            tokens += labels.shape[1]
    return total, tokens


def random_ids(batch: int, length: int, vocab: int = 53, seed: int = 0) -> torch.Tensor:
    """Token ids that avoid the special tokens 0..3."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(4, vocab, (batch, length), generator=generator)


def formula_position_encoding(length: int, d_model: int) -> torch.Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d_model)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d_model)), in float64."""
    pe = torch.zeros(length, d_model, dtype=torch.float64)
    for pos in range(length):
        for i in range(d_model // 2):
            angle = pos / 10000 ** (2 * i / d_model)
            pe[pos, 2 * i] = math.sin(angle)
            pe[pos, 2 * i + 1] = math.cos(angle)
    return pe.float()


@pytest.fixture
def model():
    return tiny_model()


def reversal_batch(generator: torch.Generator, batch: int = 32, max_length: int = 8):
    """A toy translation task: the target is the source reversed, then EOS. Sources are right-padded."""
    lengths = torch.randint(3, max_length + 1, (batch,), generator=generator)
    source = torch.randint(4, 53, (batch, max_length), generator=generator)
    mask = torch.arange(max_length)[None] < lengths[:, None]
    source = source.masked_fill(~mask, PAD)
    labels = torch.full((batch, max_length + 1), -100)
    for row, length in enumerate(lengths.tolist()):
        labels[row, :length] = source[row, :length].flip(0)
        labels[row, length] = EOS
    return source, mask.long(), labels


@contextlib.contextmanager
def built_once(tmp_path_factory, name: str):
    """A folder that the pytest-xdist workers of one run share: yields (folder, built). The first worker to get
    here builds into it (built False) while the others wait for it, then find it built."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # the run's, not one worker's
    folder = root / name
    with FileLock(f"{folder}.lock"):
        yield folder, (folder / ".built").exists()
        folder.mkdir(exist_ok=True)
        (folder / ".built").touch()


@pytest.fixture(scope="session")
def trained_model(tmp_path_factory):
    """A tiny model trained for a few seconds on reversal: its outputs vary from token to token and from
    sentence to sentence, so that decoding tests compare real choices rather than a constant. Trained once per
    run (`built_once`), saved and loaded by the other worker."""
    model = tiny_model(seed=0, authors_init=True)  # trained from the authors' initialization, as run.py trains
    with built_once(tmp_path_factory, "reversal-model") as (folder, built):
        if built:
            load_model(model, folder / "model.safetensors")
            return model.eval()
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
        generator = torch.Generator().manual_seed(0)
        for _ in range(250):
            source, mask, labels = reversal_batch(generator)
            loss = model(input_ids=source, attention_mask=mask, labels=labels).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        folder.mkdir()
        save_model(model, folder / "model.safetensors")
    return model.eval()


@pytest.fixture(scope="session")
def translation_folder(tmp_path_factory):
    """A run's output folder as training/run.py writes it (weights, code, tokenizer, generation config, metrics,
    model card), for a tiny model trained for a few seconds on the embedded EN-DE pairs with its own joint BPE.
    Built once per run (`built_once`); the tests read it, and copy it to change it."""
    with built_once(tmp_path_factory, "translator") as (folder, built):
        if not built:
            write_translation_folder(folder / "tiny-en-de")
    return folder / "tiny-en-de"


def write_translation_folder(folder) -> None:
    from training.arguments import DataArguments
    from training.default_data import generate
    from training.evaluation import score, translate
    from training.hub import write_output_folder
    from training.recipe import training_data
    from training.tokenizer import train_joint_bpe

    splits = generate()
    pairs = splits["train"][:400]
    tokenizer = train_joint_bpe((side for pair in pairs for side in pair), 250)
    model = tiny_model(seed=1, authors_init=True, vocab_size=len(tokenizer)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(60):  # 60 steps of 50 pairs: short, but its translations are words, not empty
        batch = pairs[step * 50 % 400 : step * 50 % 400 + 50]
        inputs = tokenizer([s for s, _ in batch], text_target=[t for _, t in batch], padding=True, return_tensors="pt")
        labels = inputs["labels"].masked_fill(inputs["labels"] == tokenizer.pad_token_id, -100)
        loss = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    test = splits["test"][:6]
    translations = translate(model, tokenizer, [s for s, _ in test])
    assert all(translations) and len(set(translations)) > 1, translations
    metrics = {"train_steps": 60, "train_minutes": 0.1, "test": score(translations, [t for _, t in test])}
    data = training_data(DataArguments(), {"train": pairs, "test": test})  # the embedded data, as run.py describes it
    write_output_folder(model, tokenizer, folder, metrics, data=data, length_limit=LENGTH_LIMIT,
                        source_lang="en", target_lang="de", model_id="tiny-en-de", recipe={"d_model": 24},
                        deviations=["recipe: 60 steps"], label_smoothing=0.0,  # plain cross-entropy
                        batching="batches of 50 sentences")


def multi30k_folder(folder, train_pairs: int) -> None:
    """A data folder laid out as benchmarks/multi30k.py reads it (train, valid and test2016, each NAME.en + NAME.de),
    from the embedded grammar's pairs: the first `train_pairs` of its training split, 6 and 5 of the others."""
    from training.default_data import generate

    folder.mkdir()
    splits = generate()
    for split, pairs in (("train", splits["train"][:train_pairs]), ("valid", splits["validation"][:6]),
                         ("test2016", splits["test"][:5])):
        for side, lang in enumerate(("en", "de")):
            (folder / f"{split}.{lang}").write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8")


def save_marian_folder(folder) -> None:
    """A folder holding a tiny MarianMTModel: another kind of model, for the refusals of our tools."""
    from transformers import MarianConfig, MarianMTModel

    MarianMTModel(MarianConfig(vocab_size=16, d_model=8, encoder_layers=1, decoder_layers=1, encoder_ffn_dim=8,
                               decoder_ffn_dim=8, encoder_attention_heads=2, decoder_attention_heads=2,
                               pad_token_id=0, decoder_start_token_id=0)).save_pretrained(folder)


def refusal(capfd, main, *args) -> str:
    """`main(args)` of one of our commands, run in this process: the one-line error it exits with, after nothing at
    all was written to stdout or stderr (captured at the file descriptors: libraries' logging and bars too).
    transformers' progress bars, which the commands turn off, are turned back on after."""
    from transformers.utils.logging import enable_progress_bar, is_progress_bar_enabled

    bars = is_progress_bar_enabled()
    capfd.readouterr()
    try:
        with pytest.raises(SystemExit) as stop:
            main([str(arg) for arg in args])
    finally:
        if bars:
            enable_progress_bar()
    assert capfd.readouterr() == ("", "")
    message = str(stop.value.code)
    assert message.startswith("error: ") and "\n" not in message, message
    return message


def refused_translation(capfd, monkeypatch, *args, stdin: bytes = b"") -> str:
    """`refusal` of vaswani-translate reading `stdin`; the allocator setting it makes first (allocator.py), which
    cannot be undone, stays out of the test process."""
    from vaswani_hf.tools import translate

    monkeypatch.setattr(translate, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin)))
    return refusal(capfd, translate.main, *args)


@pytest.fixture
def console(capfd, monkeypatch):
    """`COMMAND ARGS < stdin` for one of our console scripts, run in this process as its `main(args)` (a fresh process
    would add only its imports; each console script itself runs in test_readme.py): `console(main, *args,
    stdin=...)` gives a CompletedProcess with the exit status, what it wrote to stdout and stderr (captured at the file
    descriptors), and an error's message on stderr with status 1, as the interpreter writes a SystemExit's. The
    allocator setting vaswani-translate makes first (allocator.py), which cannot be undone, stays out of the test
    process; transformers' progress bars, which the commands turn off, are turned back on after."""
    from transformers.utils.logging import enable_progress_bar, is_progress_bar_enabled

    from vaswani_hf.tools import translate

    monkeypatch.setattr(translate, "keep_freed_memory", lambda: None)
    bars = is_progress_bar_enabled()

    def run(main, *args, stdin: str | bytes = b"") -> subprocess.CompletedProcess:
        data = stdin if isinstance(stdin, bytes) else stdin.encode()
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
        capfd.readouterr()
        code, message = 0, ""
        try:
            main([str(arg) for arg in args])
        except SystemExit as stop:
            code, message = (1, f"{stop.code}\n") if isinstance(stop.code, str) else (stop.code or 0, "")
        finally:
            if bars:
                enable_progress_bar()
        out, err = capfd.readouterr()
        return subprocess.CompletedProcess(args, code, out, err + message)

    return run


@pytest.fixture
def cli(console):
    """`vaswani-translate ARGS < stdin` in this process (`console`)."""
    from vaswani_hf.tools import translate

    return functools.partial(console, translate.main)


@contextlib.contextmanager
def accelerate_as_in_a_new_process():
    """Accelerate's process-wide state cleared before and after (as Accelerate's own tests clear it): code that makes
    an Accelerator runs in this process as in a process of its own, whatever an earlier test left."""
    from accelerate.state import AcceleratorState, GradientState

    def clear():
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()

    clear()
    try:
        yield
    finally:
        clear()


def commands_run_here(monkeypatch, module) -> list[list[str]]:
    """A benchmark's processes (`subprocess.run([python, module.py, *args])`) run as `module.main(args)` in this
    process: its commands, each process's work and what the parent reads back, without each process's imports. The
    list fills with each command's arguments; the TF32 switches are restored after the test (`tf32_restored`)."""
    commands = []

    def here(command, **kwargs):
        assert command[:2] == [sys.executable, module.__file__], command
        commands.append(command[2:])
        return subprocess.CompletedProcess(command, module.main(command[2:]), "", "")

    monkeypatch.setattr(subprocess, "run", here)
    tf32_restored(monkeypatch)
    return commands


def tf32_restored(monkeypatch) -> None:
    """The TF32 switches that the GPU benchmarks set in their process, restored after the test that runs them here."""
    for backend in (torch.backends.cuda.matmul, torch.backends.cudnn):
        monkeypatch.setattr(backend, "allow_tf32", backend.allow_tf32)


def attention_in_steps(monkeypatch, owner, method: str) -> set:
    """The attention functions ("sdpa": torch's SDPA, "eager": the model's own) called within `owner.method` (a
    training step), collected as a run calls them."""
    import vaswani_hf.modeling_vaswani as modeling

    inside, called = [False], set()

    def recorded(kind, attend):
        def wrapped(*args, **kwargs):
            if inside[0]:
                called.add(kind)
            return attend(*args, **kwargs)
        return wrapped

    def marked(step):
        def wrapped(*args, **kwargs):
            inside[0] = True
            try:
                return step(*args, **kwargs)
            finally:
                inside[0] = False
        return wrapped

    monkeypatch.setattr(owner, method, marked(getattr(owner, method)))
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        recorded("sdpa", torch.nn.functional.scaled_dot_product_attention))
    monkeypatch.setattr(modeling, "eager_attention_forward", recorded("eager", modeling.eager_attention_forward))
    return called


def throw(error: BaseException):
    """Raises `error`: a stand-in for a call that fails, written as an expression."""
    raise error


def run_training(*argv) -> None:
    """training/run.py's main() with these arguments, in this process: for one process that nothing kills, a process
    of its own would add only its imports. The allocator setting it makes (allocator.py), which cannot be undone,
    stays out of the test process; Accelerate's state is a new process's (`accelerate_as_in_a_new_process`), so that
    each run starts as the command does; torch's thread count is restored."""
    import training.run

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as patch, accelerate_as_in_a_new_process():
        patch.setattr(sys, "argv", ["run.py", *map(str, argv)])
        patch.setattr(training.run, "keep_freed_memory", lambda: None)
        try:
            training.run.main()
        finally:
            torch.set_num_threads(threads)


def run_or_show_stacks(command: list[str], env: dict, timeout: float,
                       cwd: os.PathLike | None = None) -> subprocess.CompletedProcess:
    """`command` run to its end, its output captured as text. If it is still running after `timeout` seconds (a
    hang: nothing run this way needs that long), every process it started, itself included, prints each thread's
    Python stack (faulthandler, on SIGABRT) and the test fails with what they printed: where each one waited. Their
    output is unbuffered, so that it shows every line printed before the hang (a signal loses what a buffer holds)."""
    env = {**env, "PYTHONFAULTHANDLER": "1", "PYTHONUNBUFFERED": "1"}
    with subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True) as process:
        try:
            stdout, stderr = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            launched = psutil.Process(process.pid)
            processes = [*launched.children(recursive=True), launched]
            stdout = stderr = ""
            for ending in (signal.SIGABRT, signal.SIGKILL):  # SIGKILL: for any that do not end on SIGABRT
                for member in processes:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        member.send_signal(ending)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    stdout, stderr = process.communicate(timeout=60)
                    break
            pytest.fail(f"still running after {timeout} s: {' '.join(command)}\nit printed:\n{stdout[-3000:]}\n"
                        f"its processes' threads, and what else they printed:\n{stderr[-30000:]}")
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def run_hidden(script: str, *args, env_extra=None, cwd=None) -> str:
    """Run `script` in a fresh Python where `import vaswani_hf` fails, offline; returns its stdout."""
    result = run_without("vaswani_hf", script, *args, env_extra=env_extra, cwd=cwd)
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def run_without(package: str, script: str, *args, env_extra=None, cwd=None) -> subprocess.CompletedProcess:
    """Run `script` in a fresh Python where importing `package` fails, offline."""
    prelude = textwrap.dedent(
        f"""
        import importlib.abc, sys

        class Hide(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == {package!r} or name.startswith({package + "."!r}):
                    raise ModuleNotFoundError(f"{{name}} is hidden for this test")

        sys.meta_path.insert(0, Hide())
        """
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    if package == "vaswani_hf":
        env.pop("PYTHONPATH", None)
    return subprocess.run([sys.executable, "-c", prelude + textwrap.dedent(script), *map(str, args)],
                          cwd=cwd, env=env, check=False, capture_output=True, text=True, timeout=300)
