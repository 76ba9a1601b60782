#!/usr/bin/env bash
# What one lent GPU machine runs, in one call of the device tool (at most 10 minutes a call, 15 of device time a
# session): issue 77's utilisation figures, then as much of the rest as the time left allows. Prepare here first:
#
#     bash benchmarks/gpu_wheels.sh          # the wheels the GPU machine lacks, into .whl/
#
# then the device call, `carry: [".whl"]`, timeout 590:
#
#     bash benchmarks/gpu_session.sh
#
# Parts, in order, each under its own time limit, each writing into $OUT what came back even if a later one fails:
#   1. benchmarks/utilisation.py, base and big, 3 processes each (about 6 minutes; UTILISATION_PROCESSES=N to change);
#   2. benchmarks/gpu_check.py --parts training remote: run.py's base preset compiled, resumed and eager, 200 steps
#      each, and the remote-code check (about 5 minutes: it runs only if at least 4 minutes are left).
# The figures go to the notebook (benchmarks/README.md) and the README's GPU section.
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out=${OUT:-/tmp/gpu-session}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || { echo "error: the wheels did not install: bash benchmarks/gpu_wheels.sh here first, carry .whl"; exit 1; }
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"

timeout 400 python3 benchmarks/utilisation.py --output_dir /tmp/utilisation \
    --processes "${UTILISATION_PROCESSES:-3}" 2>&1 | tee "$out/utilisation.log"
cp /tmp/utilisation/utilisation.json /tmp/utilisation/utilisation.md "$out/" 2>/dev/null

left=$((580 - (SECONDS - started)))
if [ "$left" -ge 240 ]; then
    timeout "$left" python3 benchmarks/gpu_check.py --parts training remote --output_dir /tmp/check 2>&1 \
        | tail -40 | tee "$out/gpu_check.log"
    cp /tmp/check/gpu_check.json /tmp/check/gpu_check.md "$out/" 2>/dev/null
else
    echo "gpu_session: $left s left, too few for gpu_check's training part" | tee "$out/gpu_check.log"
fi
echo "gpu_session: $((SECONDS - started)) s"
