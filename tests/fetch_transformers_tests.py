"""Fetch transformers' own common model tests for the installed transformers version: on first use by
`tests/test_transformers_common.py` (once per version, whichever test process gets there first), or by hand:

    python tests/fetch_transformers_tests.py

transformers publishes `tests/test_modeling_common.py` (ModelTesterMixin) in its source distribution on PyPI.
This script downloads that sdist with pip (the package registry: no other network), and unpacks its top-level
test modules as the package `transformers_tests` under `.cache/transformers-tests/<version>/`, where
`tests/test_transformers_common.py` runs them against our model. Nothing of it is committed.

The sdist leaves out two modules that test_modeling_common imports: `generation/test_utils.py`
(GenerationTesterMixin) and `exporters/test_export.py`. They are replaced by empty mixins here; the generation
checks are made by our own tests/test_generation.py.
"""

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import tarfile
import tempfile

import transformers
from filelock import FileLock

ROOT = pathlib.Path(__file__).resolve().parent.parent
TARGET = ROOT / ".cache" / "transformers-tests" / transformers.__version__
PACKAGE = TARGET / "transformers_tests"
STUBS = {
    "generation/test_utils.py": "class GenerationTesterMixin:\n    pass\n",
    "exporters/test_export.py": "class ExportTesterMixin:\n    pass\n",
}


def fetch() -> pathlib.Path:
    """The package, downloaded and unpacked the first time; test processes starting together wait for one download."""
    if (PACKAGE / "test_modeling_common.py").exists():
        return PACKAGE
    TARGET.mkdir(parents=True, exist_ok=True)
    with FileLock(str(TARGET / ".lock")):
        if not (PACKAGE / "test_modeling_common.py").exists():
            download_into(PACKAGE)
    return PACKAGE


def download_into(package: pathlib.Path) -> None:
    # pip prepares the sdist's metadata with setuptools (its build backend): the one installed here if there is one
    # (7 s on a Zen 3), else one that pip installs into a build environment of its own first (12 s).
    isolation = ["--no-build-isolation"] if importlib.util.find_spec("setuptools") else []
    with tempfile.TemporaryDirectory() as download:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", ":all:", *isolation,
             f"transformers=={transformers.__version__}", "--dest", download],
            check=True,
        )
        (sdist,) = pathlib.Path(download).glob("transformers-*.tar.gz")
        staging = pathlib.Path(download) / "transformers_tests"
        staging.mkdir()
        with tarfile.open(sdist) as archive:
            for member in archive.getmembers():
                parts = pathlib.PurePosixPath(member.name).parts
                if len(parts) == 3 and parts[1] == "tests" and parts[2].endswith(".py") and member.isfile():
                    (staging / parts[2]).write_bytes(archive.extractfile(member).read())
        for relative, text in STUBS.items():
            (staging / relative).parent.mkdir(exist_ok=True)
            (staging / relative).parent.joinpath("__init__.py").touch()
            (staging / relative).write_text(text, encoding="utf-8")
        (staging / "__init__.py").touch()
        shutil.rmtree(package, ignore_errors=True)
        shutil.move(str(staging), package)


if __name__ == "__main__":
    print(f"transformers {transformers.__version__} common tests in {fetch()}")
