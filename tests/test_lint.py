"""The linter passes: the ruff pinned in the test extra, with the project's settings (pyproject.toml)."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ruff_finds_nothing_and_is_the_pinned_version():
    pinned = re.findall(r'"ruff==([^"]+)"', (ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    version = subprocess.run([sys.executable, "-m", "ruff", "--version"], check=True, capture_output=True, text=True)
    assert version.stdout.split() == ["ruff", *pinned], f"{version.stdout.strip()}, not the pinned ruff {pinned}"
    result = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                            cwd=ROOT, check=False, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
