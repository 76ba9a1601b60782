"""The README's commands and code, run as a reader would run them, so that the guide cannot rot: each shell and Python
block, in order, in one fresh folder, with a small model where a block names a bigger one (SMALLER), and only the
blocks listed in NOT_RUN left out, each with its reason. The Hub is huggingface_hub's calls recorded
(tests/upload_capture), not the network."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from training.default_data import generate

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
BLOCKS = re.findall(r"^```(bash|python)\n(.*?)^```", README, re.DOTALL | re.MULTILINE)

# The first line of each block the test does not run, and why.
NOT_RUN = {
    "pip install torch==2.13.0": "installs packages: .ci/run runs these lines (test_ci_runs_the_readmes_set_up)",
    "accelerate launch training/run.py --preset base": "GPUs and a Hub dataset (benchmarks/gpu_check.py runs one GPU)",
    "accelerate launch --config_file training/accelerate_configs/fsdp_two_nodes.yaml": "two machines with GPUs",
    "#!/bin/bash": "a SLURM cluster",
    "vaswani-convert marian": "released weights to download (tests/test_convert.py converts stand-ins of both)",
}
# Lines run at a small size: the README's command, then what the test appends (flags win over the preset's values).
TINY = ("--d_model 32 --d_ff 64 --num_heads 4 --num_layers 3 --vocab_size 300 --max_train_minutes 0.05 "
        "--evaluations 0 --eval_max_sentences 8 --alpha_candidates 0.6")
SMALLER = {"accelerate launch training/run.py --preset cpu-small": TINY,
           "accelerate launch training/run.py --preset cpu-medium": TINY}
SKIPPED_LINES = {"python -m pytest": "the suite itself", "ruff check .": "tests/test_lint.py runs it"}


def blocks_to_run() -> list[tuple[str, str]]:
    return [(language, code) for language, code in BLOCKS
            if not any(code.startswith(first) for first in NOT_RUN)]


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
    for prefix in [*SMALLER, *SKIPPED_LINES]:
        assert any(prefix in " ".join(shell_lines(code)) for _, code in BLOCKS), prefix
    assert len(blocks_to_run()) == len(BLOCKS) - len(NOT_RUN) >= 8


def test_ci_runs_the_readmes_set_up():
    """.ci/run installs exactly as the README's set-up says, then runs the README's test command."""
    setup = next(code for _, code in BLOCKS if code.startswith("pip install torch==2.13.0"))
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line and not line.startswith(("#", "set ", "cd "))]
    assert ci == shell_lines(setup) + ["python -m pytest"]


@pytest.mark.long(minutes=3)
def test_the_readmes_blocks_run_in_order(tmp_path):
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
            (tmp_path / "data" / f"{name}.{lang}").write_text("".join(row[side] + "\n" for row in rows))
    (tmp_path / "sources.txt").write_text("".join(en + "\n" for en, _ in splits["test"][:3]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests" / "upload_capture")]),
           "UPLOAD_CAPTURE": str(tmp_path / "upload.json"),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    for language, code in blocks_to_run():
        if language == "python":
            commands = [[sys.executable, "-c", code]]
        else:
            commands = [["bash", "-c", line + next((" " + extra for start, extra in SMALLER.items()
                                                    if line.startswith(start)), "")]
                        for line in shell_lines(code) if not any(line.startswith(s) for s in SKIPPED_LINES)]
        for command in commands:
            result = subprocess.run(command, cwd=tmp_path, env=env, check=False, capture_output=True, text=True,
                                    timeout=900)
            assert result.returncode == 0, f"{command[-1]}\n{result.stdout[-2000:]}\n{result.stderr[-3000:]}"
    assert (tmp_path / "outputs" / "run" / "model.safetensors").is_file()
    assert (tmp_path / "translations.txt").read_text().count("\n") == 3
    assert (tmp_path / "upload.json").is_file()
