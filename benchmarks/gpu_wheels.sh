#!/usr/bin/env bash
# The wheels benchmarks/gpu_check.py needs on the lent GPU machine beyond what its image holds (Python 3.12, torch,
# pyarrow, sacrebleu; transformers 5.17 and huggingface_hub 1.33, older than ours): downloaded here from PyPI into
# .whl/ (git ignores it), at the versions installed here, which the tests passed with. About 26 MB: transformers 5.25
# refuses to import beside a huggingface_hub older than 2.4, whose own needs (httpx2 and the rest) the image lacks
# (2026-12-04). CTranslate2's wheel (43 MB, for gpu_decoding.py's CTranslate2 columns; that part runs without it) no
# longer fits beside them in a device call's 64 MiB: `bash benchmarks/gpu_wheels.sh ctranslate2` adds it and refuses
# when the call would carry too much.
#
#     bash benchmarks/gpu_wheels.sh [ctranslate2]
#
# Then one call of the device tool, `carry: [".whl"]` (and ".data": gpu_session.sh's header): `bash
# benchmarks/gpu_session.sh` (timeout 590 s: the parts its header names), or the whole GPU check (timeout 540 s,
# about 7.5 minutes; its training runs stay there, the report and the table come back):
#
#     python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#         .whl/*.whl && export PYTHONPATH=/tmp/site || exit; PYTHONUNBUFFERED=1 USE_HUB_KERNELS=NO \
#         python3 benchmarks/gpu_check.py --output_dir /tmp/check; cp /tmp/check/gpu_check.json \
#         /tmp/check/gpu_check.md $OUT/
set -euo pipefail
cd "$(dirname "$0")/.."

# transformers, accelerate and what they need newer than the image's (huggingface_hub 2 and its HTTP client); datasets
# and evaluate, which it lacks, and theirs; sacremoses (run.py's final evaluation: Table 2's BLEU) and joblib.
packages=(transformers regex tokenizers safetensors accelerate huggingface_hub httpx2 httpcore2 truststore hf-xet click
          anyio idna h11 datasets evaluate dill multiprocess fsspec sacremoses joblib)
case "${1:-}" in
    "") ;;
    ctranslate2) packages+=(ctranslate2) ;;
    *) echo "error: unknown argument $1: ctranslate2 or nothing" >&2; exit 1 ;;
esac
pinned=$(python - "${packages[@]}" <<'EOF'
import importlib.metadata as metadata
import sys

try:
    print(" ".join(f"{name}=={metadata.version(name)}" for name in sys.argv[1:]))
except metadata.PackageNotFoundError as error:
    sys.exit(f"error: {error.name} is not installed here: pip install -e '.[test,export]' first (README, Install)")
EOF
)
rm -rf .whl
python -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl $pinned
echo "$pinned: $(du -sh .whl | cut -f1) in .whl/"
# The device call carries the working tree (tracked and untracked files git does not ignore) and .whl/: 64 MiB at most.
tree=$(git ls-files -z --cached --others --exclude-standard |  # a file deleted but not committed travels not
    { du -cb --files0-from=- 2>/dev/null || true; } | tail -1 | cut -f1)
wheels=$(du -sb .whl | cut -f1)
echo "the device call carries $(( (tree + wheels) >> 20 )) MiB of 64: the working tree $(( tree >> 20 )), .whl/ $(( wheels >> 20 ))"
if [ $((tree + wheels)) -gt $((64 << 20)) ]; then
    echo "error: over the device call's 64 MiB: leave out a wheel the image holds, or untracked files" >&2
    exit 1
fi
