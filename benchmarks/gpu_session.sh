#!/usr/bin/env bash
# What a lent GPU machine runs for issue 77, in one call of the device tool (at most 10 minutes a call, 15 of device
# time a session, a fresh machine's start included). Prepare here first:
#
#     bash benchmarks/gpu_wheels.sh          # the wheels the GPU machine lacks, into .whl/
#
# then the device call, `carry: [".whl"]`, timeout 590:
#
#     bash benchmarks/gpu_session.sh [PART ...]      # default: speed utilisation decoding training
#
# Parts, in the order given, each skipped when fewer seconds are left of the call's 580 than it needs, each leaving
# its report in $OUT even when a later one fails:
#   speed        benchmarks/speed.py --sizes small base on the host's CPU, pinned to cores 0 and 1 with 2 threads (the
#                2-core machine's stand-in), in the background while the GPU parts run on the other cores: 5 min;
#   utilisation  benchmarks/utilisation.py, base and big, 3 processes each (UTILISATION_PROCESSES=N): about 6 min;
#   decoding     benchmarks/gpu_decoding.py, 3,000 sentences, ours beside transformers' and CTranslate2: about 2 min;
#   training     benchmarks/gpu_check.py --parts training remote: run.py's base preset compiled, resumed and eager,
#                200 steps each, and the remote-code check: about 5 min.
# What comes back (each part's log and JSON report) goes to the notebook (benchmarks/README.md) and the README's GPU
# section. GPU_SESSION_TINY=1 runs the same parts here, at tiny sizes on the CPU, without the wheels (a dry run).
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out=${OUT:-/tmp/gpu-session}
mkdir -p "$out"
tiny=${GPU_SESSION_TINY:+--tiny}
if [ -z "$tiny" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || { echo "error: the wheels did not install: bash benchmarks/gpu_wheels.sh here, carry .whl"; exit 1; }
    export PYTHONPATH=/tmp/site
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

run() {  # NAME SECONDS_NEEDED COMMAND...: the command under the time left, its log and its report into $OUT
    local name=$1 needed=$2 left=$((580 - (SECONDS - started)))
    shift 2
    if [ "$left" -lt "$needed" ]; then
        echo "gpu_session: $name skipped, $left s left of the $needed it needs"
        return
    fi
    timeout "$left" $pin "$@" $tiny > "$out/$name.log" 2>&1
    echo "gpu_session: $name ended ($?) at $((SECONDS - started)) s"
    tail -30 "$out/$name.log"
}

pin=""
for part in "${@:-speed utilisation decoding training}"; do
    for name in $part; do
        case $name in
            speed) sizes=${tiny:+--sizes small --repeats 1}
                   PYTHONPATH=".:${PYTHONPATH:-}" timeout 570 taskset -c 0,1 python3 benchmarks/speed.py \
                       ${sizes:---sizes small base} > "$out/speed.log" 2>&1 &
                   [ "$(nproc)" -gt 2 ] && pin="taskset -c 2-$(($(nproc) - 1))" ;;
            utilisation) run utilisation 300 python3 benchmarks/utilisation.py --output_dir /tmp/gpu-session-u \
                             --processes "${UTILISATION_PROCESSES:-3}"
                         cp /tmp/gpu-session-u/utilisation.json "$out/" ;;
            decoding) run decoding 100 python3 benchmarks/gpu_decoding.py --output_dir /tmp/gpu-session-d
                      cp /tmp/gpu-session-d/decoding.json "$out/" ;;
            training) run training 240 python3 benchmarks/gpu_check.py --parts training remote \
                          --output_dir /tmp/gpu-session-t
                      cp /tmp/gpu-session-t/gpu_check.json "$out/" ;;
            *) echo "error: unknown part $name: speed, utilisation, decoding, training"; exit 1 ;;
        esac
    done
done
wait
[ -f "$out/speed.log" ] && tail -40 "$out/speed.log"
echo "gpu_session: $((SECONDS - started)) s"
