"""The README's commands and code, run as a reader would run them, so that the guide cannot rot: each shell and Python
block, in order, in one fresh folder, with a small model where a block names a bigger one (SMALLER), and only the
blocks listed in NOT_RUN left out, each with its reason. Training lines, the quick start's translation and the Python
blocks run as processes of their own (the own-data training line forked, FORKED); our other console-script lines as
their `main(args)` here (IN_PROCESS). The Hub is huggingface_hub's calls recorded (tests/upload_capture), not the
network."""

import importlib
import itertools
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from forked import run_launch_command
from support import run_or_show_stacks

from training.default_data import generate

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```(bash|python)\n(.*?)^```", README, re.DOTALL | re.MULTILINE)

# The first line of each block the test does not run, and why.
NOT_RUN = {
    "pip install torch==2.13.0": "installs packages: .ci/run runs these lines (test_ci_runs_the_readmes_set_up)",
    "accelerate launch training/run.py --preset base": "GPUs and a Hub dataset (benchmarks/gpu_check.py runs one GPU)",
    "accelerate launch --config_file training/accelerate_configs/fsdp_two_nodes.yaml": "two machines with GPUs",
    "#!/bin/bash": "a SLURM cluster",
    "vaswani-convert marian": "released weights to download (tests/test_convert.py converts stand-ins of each)",
}
# Lines run at a small size: the README's command, then what the test appends (flags win over the preset's values).
# 3 encoder layers for vaswani-attention's --layer 2; one decoder layer: the ONNX export's time grows with each.
TINY = ("--d_model 32 --d_ff 64 --num_heads 4 --num_layers 3 --num_decoder_layers 1 --vocab_size 300 "
        "--max_train_minutes 0.05 --evaluations 0 --eval_max_sentences 8 --alpha_candidates 0.6")
SMALLER = {"accelerate launch training/run.py --preset cpu-small": TINY,
           "accelerate launch training/run.py --preset cpu-medium": TINY}
SKIPPED_LINES = {"python -m pytest": "the suite itself", "ruff check .": "tests/test_lint.py runs it"}
# Our console scripts and training/score.py, run as `main(args)` in this process (support's `console`: a process of
# their own would add only its imports, 5-7 s each); the quick start's `echo ... | vaswani-translate` runs the
# installed script itself.
IN_PROCESS = {"vaswani-translate": "vaswani_hf.tools.translate", "vaswani-attention": "vaswani_hf.tools.visualize",
              "vaswani-export": "vaswani_hf.tools.export", "vaswani-push": "vaswani_hf.tools.hub",
              "python training/score.py": "training.score"}


# Launches run as the launcher runs them, run.py forked from an interpreter that has imported it, with the launcher's
# environment (forked.py): its imports, 10-15 s on a slow CPU, are paid once. The quick start runs the launcher itself.
FORKED = ("accelerate launch training/run.py --preset cpu-medium",)


def blocks_to_run() -> list[tuple[str, str]]:
    return [(language, code) for language, code in BLOCKS
            if not any(code.startswith(first) for first in NOT_RUN)]


def commands(blocks: list[tuple[str, str]]) -> list[list[str]]:
    """What runs `blocks` in order: each shell line (with SMALLER's flags), and consecutive Python blocks in one
    interpreter, as a reader pastes them into one session, each block with names of its own."""
    found = []  # (language, command)
    for language, code in blocks:
        if language == "python" and found and found[-1][0] == "python":
            found[-1][1][-1] += f"\nexec({code!r}, {{}})"
        elif language == "python":
            found.append((language, [sys.executable, "-c", f"exec({code!r}, {{}})"]))
        else:
            found += [(language, ["bash", "-c", line + next((" " + extra for start, extra in SMALLER.items()
                                                              if line.startswith(start)), "")])
                      for line in shell_lines(code) if not any(line.startswith(s) for s in SKIPPED_LINES)]
    return [command for _, command in found]


def shell_lines(code: str) -> list[str]:
    """The block's commands: continuation lines joined, comments and blank lines dropped."""
    lines = []
    for line in code.replace("\\\n", " ").splitlines():
        command = re.sub(r"\s+#.*$", "", line).strip()
        if command and not command.startswith("#"):
            lines.append(" ".join(command.split()))
    return lines


def test_every_block_is_run_or_listed_with_its_reason():
    """A block the README gains is run unless listed here; a listed block that is gone from the README is an error."""
    firsts = [code.splitlines()[0] for _, code in BLOCKS]
    for first in NOT_RUN:
        assert any(line.startswith(first) for line in firsts), f"NOT_RUN lists a block the README lacks: {first}"
    for prefix in [*SMALLER, *SKIPPED_LINES, *FORKED]:
        assert any(prefix in " ".join(shell_lines(code)) for _, code in BLOCKS), prefix
    assert len(blocks_to_run()) == len(BLOCKS) - len(NOT_RUN) >= 8


def test_ci_runs_the_readmes_set_up():
    """.ci/run installs exactly as the README's set-up says, then runs the README's test command."""
    setup = next(code for _, code in BLOCKS if code.startswith("pip install torch==2.13.0"))
    ci = [line for line in (ROOT / ".ci" / "run").read_text(encoding="utf-8").splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == shell_lines(setup) + ["python -m pytest"]


@pytest.mark.parametrize("asked", [None, "5"])
def test_the_test_command_starts_a_worker_a_core_it_may_use(pytestconfig, monkeypatch, asked):
    """`python -m pytest`: a worker a core it may use (README), as joblib counts them (the affinity: `taskset`, a
    cluster job's cpuset; a container's CPU limit), not one a core of the machine, which psutil counts (conftest.py's
    hook answers xdist's question); PYTEST_XDIST_AUTO_NUM_WORKERS, where set, still decides."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})  # one of the machine's cores, as `taskset -c 0`
    if asked:
        monkeypatch.setenv("PYTEST_XDIST_AUTO_NUM_WORKERS", asked)
    assert pytestconfig.hook.pytest_xdist_auto_num_workers(config=pytestconfig) == int(asked or 1)


def run_here(console, monkeypatch, folder, words: list[str]) -> subprocess.CompletedProcess:
    """A line of one of our console scripts (`IN_PROCESS`, named by `words[0]`) in this process, in `folder`, with its
    `< FILE` and `> FILE` redirections; the Hub's two calls recorded as the upload_capture of the subprocesses records
    them."""
    import huggingface_hub
    from upload_capture.sitecustomize import recorders

    main = importlib.import_module(IN_PROCESS[words[0]]).main
    redirections = ("<", ">")
    redirected = {word: folder / name for word, name in itertools.pairwise(words) if word in redirections}
    args = [word for before, word in itertools.pairwise(words)
            if word not in redirections and before not in redirections]
    create_repo, upload_folder = recorders(str(folder / "upload.json"))
    with monkeypatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
        patch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
        result = console(main, *args, stdin=redirected["<"].read_bytes() if "<" in redirected else b"")
    if ">" in redirected:
        redirected[">"].write_text(result.stdout, encoding="utf-8")
    return result


@pytest.mark.long(minutes=1.9)
def test_the_readmes_blocks_run_in_order(tmp_path, console, monkeypatch):
    """Every block not in NOT_RUN, in the README's order, in one folder: the quick start trains `outputs/run` (a small
    model for a few seconds) that the later blocks translate, export, push and load; the own-data block trains on
    aligned text files written here from the embedded data."""
    for folder in ("training", "benchmarks"):  # the README's commands run from the repository's root
        (tmp_path / folder).symlink_to(ROOT / folder)
    splits = generate()
    (tmp_path / "data").mkdir()
    for split, name in (("train", "train"), ("validation", "valid"), ("test", "test")):
        for side, lang in enumerate(("en", "de")):
            rows = splits[split][: 2000 if split == "train" else 8]
            (tmp_path / "data" / f"{name}.{lang}").write_text("".join(row[side] + "\n" for row in rows),
                                                              encoding="utf-8")
    (tmp_path / "sources.txt").write_text("".join(en + "\n" for en, _ in splits["test"][:3]), encoding="utf-8")
    (tmp_path / "refs.txt").write_text("".join(de + "\n" for _, de in splits["test"][:3]), encoding="utf-8")
    monkeypatch.setenv("VASWANI_HF_CACHE", str(tmp_path / "cache"))  # vaswani-translate --engine ctranslate2's
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "upload_capture")]),
           "UPLOAD_CAPTURE": str(tmp_path / "upload.json"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for command in commands(blocks_to_run()):
        line = command[-1] if command[0] == "bash" else ""
        script = next((name for name in IN_PROCESS if line.startswith(f"{name} ")), None)
        if script:
            result = run_here(console, monkeypatch, tmp_path, [script, *shlex.split(line.removeprefix(script))])
        elif line.startswith(FORKED):
            result = run_launch_command(shlex.split(line)[2:], env, timeout=900, cwd=tmp_path)
        else:
            result = run_or_show_stacks(command, env, timeout=900, cwd=tmp_path)
        assert result.returncode == 0, f"{command[-1]}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert (tmp_path / "outputs" / "run" / "model.safetensors").is_file()
    assert (tmp_path / "translations.txt").read_text(encoding="utf-8").count("\n") == 3
    assert (tmp_path / "upload.json").is_file()
