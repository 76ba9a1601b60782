#!/usr/bin/env bash
# What a lent GPU machine runs for issues 77 and 78, in one call of the device tool (at most 10 minutes a call, 15 of
# device time a session, a fresh machine's start included). Prepare here first:
#
#     bash benchmarks/gpu_wheels.sh          # the wheels the GPU machine lacks, into .whl/
#     mkdir -p .data && cp -r ../shared/data/multi30k .data/    # training's real text (git ignores .data/)
#
# then the device call, `carry: [".whl", ".data"]`, timeout 590:
#
#     bash benchmarks/gpu_session.sh [PART ...]      # default: training
#
# and at once (a warm machine goes back after 30 s idle), a second call with the lease's time left (15 minutes a
# session; the first call's start and transfers took about 30 s, a later call's 12 s), timeout T, GPU_SESSION_SECONDS
# about T - 10. The next lease's plan, whether the C++ wrapper should be run.py's default on a GPU (the two on one
# machine), and where the GPU idles 7 ms of a base step (utilisation.py's steady profile and steady.json.gz, in each
# part that runs it): `speed base` first (about 450 s; speed on the host's cores 0-1 beside it, at no extra time), then:
#
#     GPU_SESSION_SECONDS=300 bash benchmarks/gpu_session.sh wrapper
#
# Parts, in the order given, each skipped when fewer seconds are left of the call's GPU_SESSION_SECONDS (580) than it
# needs, each leaving its report even when a later one fails (the slowest last: what is cut is the least needed):
#   speed     benchmarks/speed.py --sizes small base on the host's CPU, pinned to cores 0 and 1 with 2 threads (the
#             2-core machine's stand-in), in the background while the GPU parts run on the other cores: 5 min;
#   base      utilisation.py, base, as run.py trains by default (compiled by inductor, SDPA without cuDNN's kernels),
#             3 processes, Marian beside (torch's choice of kernels): 7.5 min (2026-11-30: 445 s, the first process
#             202 s, the others 111-117 s with inductor's cache);
#   wrapper   as base, 1 process, no Marian, inductor's kernels called from C++ (TORCHINDUCTOR_CPP_WRAPPER=1), not
#             Python: whether the host's time a step sets base's pace (utilisation.py's issue seconds): about 4 min
#             (2026-12-06, H100: 228 s, its warm-up 172 s: its C++ is compiled too);
#   big       as base, big, 1 process: about 3.5 min (off the default since session 75: 35.6% in session 70, over
#             its target, and the step has only lost work since);
#   training  benchmarks/gpu_check.py --parts training remote: run.py's base preset compiled, eager and resumed,
#             200 steps each, and the remote-code check, dynamo's reasons for compiling again in the runs' logs: about
#             4-5 min (2026-12-04: 204-282 s; 2026-12-06, H100: 238 s); on `.data/multi30k` when the call carries it,
#             else the embedded grammar; at the paper's warm-up since 2026-12-04 (benchmarks/README.md, session 132);
#   eager     as base, eager (`--compile no`), 1 process: 1 min;
#   cudnn     as eager, with cuDNN's attention kernels for ours too (`--cudnn_attention`): 1 min;
#   decoding  benchmarks/gpu_decoding.py, 3,000 sentences, ours (and with fast_cpu's lean decoder step) beside
#             transformers' and CTranslate2 (whose wheel no longer fits beside the others: gpu_wheels.sh's header):
#             2 min;
#   fp16      the training part's runs in fp16 (`--mixed_precision fp16`: a GPU without bfloat16, V100 or T4, trains
#             so; its loss scale kept in each checkpoint), no remote part: about 4 min (2026-12-06, H100: 227 s);
#   deterministic  run.py's --deterministic: base's step with it (1 process, no Marian: its cost against base's), then
#             the training part's runs with it (on its text), whose resumed run must repeat the first's losses
#             exactly: 10 min.
# Every part's log and reports come back as $OUT/gpu_session.tgz (and the speed log beside it); they go to the notebook
# (benchmarks/README.md) and the README. GPU_SESSION_TINY=1 runs the same parts here, at tiny sizes on the CPU, without
# the wheels (a dry run).
set -uo pipefail
cd "$(dirname "$0")/.."
started=$SECONDS
out=${OUT:-/tmp/gpu-session}
scratch=$(mktemp -d /tmp/gpu-session.XXXXXX)  # this run's own: another on the machine keeps its own
trap 'rm -rf "$scratch"' EXIT
work=$scratch/parts
mkdir -p "$out" "$work"
parts="${*:-training}"  # each argument one part or several
for name in $parts; do  # every name checked before anything runs
    case $name in
        speed | base | wrapper | big | training | eager | cudnn | decoding | fp16 | deterministic) ;;
        *) echo "error: unknown part $name: speed, base, wrapper, big, training, eager, cudnn, decoding, fp16," \
                "deterministic"
           exit 1 ;;
    esac
done
tiny=${GPU_SESSION_TINY:+--tiny}
if [ -z "$tiny" ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || { echo "error: the wheels did not install: bash benchmarks/gpu_wheels.sh here, carry .whl"; exit 1; }
    export PYTHONPATH=/tmp/site
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
# CTranslate2's wheel is built for CUDA 12 and opens libcublas.so.12 by name; the image holds CUDA 13's cuBLAS alone.
# The calls CTranslate2 makes (cublasCreate_v2, cublasGemmEx, cublasSgemm_v2 and their batched forms) keep their names
# and arguments in cuBLAS 13, so the decoding part finds 13 under the name 12 (gpu_decoding.py reports the file).
cublas12=$scratch/cublas12
mkdir -p "$cublas12"
cublas13=$(python3 -c 'import glob, site
roots = [*site.getsitepackages(), "/usr/local/cuda/lib64", "/usr/local/cuda/targets/x86_64-linux/lib"]
print(min((f for r in roots for f in glob.glob(f"{r}/**/libcublas.so.13*", recursive=True)), default=""))')
[ -n "$cublas13" ] && ln -s "$cublas13" "$cublas12/libcublas.so.12" && cublas12="$cublas12:$(dirname "$cublas13")"
# From transformers 5.25, from_pretrained loads Hub kernels unless USE_HUB_KERNELS=NO, and refuses to load a model
# without the `kernels` package, which the wheels leave out (and no Hub is reached from here; our model has no
# layer a Hub kernel replaces).
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false USE_HUB_KERNELS=NO

pin=""
text=$([ -d .data/multi30k ] && echo --training_data .data/multi30k)  # the training runs' real text, if carried
run() {  # NAME SECONDS_NEEDED COMMAND...: the command under the time left, its log into the parts' folder
    local name=$1 needed=$2 left=$((${GPU_SESSION_SECONDS:-580} - (SECONDS - started)))
    shift 2
    if [ "$left" -lt "$needed" ]; then
        echo "gpu_session: $name skipped, $left s left of the $needed it needs"
        return
    fi
    timeout "$left" $pin "$@" $tiny > "$work/$name.log" 2>&1
    echo "gpu_session: $name ended ($?) at $((SECONDS - started)) s"
    tail -20 "$work/$name.log"
}

utilisation() {  # NAME SECONDS_NEEDED FLAGS...: benchmarks/utilisation.py into its own folder
    local name=$1 needed=$2
    shift 2
    run "$name" "$needed" python3 benchmarks/utilisation.py --output_dir "$work/$name" "$@"
}

for name in $parts; do
    case $name in
        speed) sizes=${tiny:+--sizes small --repeats 1}
               PYTHONPATH=".:${PYTHONPATH:-}" timeout $((${GPU_SESSION_SECONDS:-580} - 10)) \
                   taskset -c 0,1 python3 benchmarks/speed.py ${sizes:---sizes small base} >"$out/speed.log" 2>&1 &
               [ "$(nproc)" -gt 2 ] && pin="taskset -c 2-$(($(nproc) - 1))" ;;
        base) utilisation base 240 --sizes base --processes 3 ;;
        big) utilisation big 200 --sizes big --processes 1 ;;
        wrapper) TORCHINDUCTOR_CPP_WRAPPER=1 utilisation wrapper 200 --sizes base --processes 1 --skip_marian \
                     --compile inductor ;;
        eager) utilisation eager 60 --sizes base --processes 1 --compile no ;;
        cudnn) utilisation cudnn 60 --sizes base --processes 1 --compile no --cudnn_attention ;;
        decoding) run decoding 120 env LD_LIBRARY_PATH="$cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                      python3 benchmarks/gpu_decoding.py --output_dir "$work/decoding" ;;
        training) run training 360 env TORCH_LOGS=recompiles python3 benchmarks/gpu_check.py \
                      --parts training remote $text --output_dir "$work/training" ;;
        fp16) run fp16 240 python3 benchmarks/gpu_check.py --parts training --mixed_precision fp16 $text \
                  --output_dir "$work/fp16" ;;
        deterministic) utilisation deterministic-step 150 --sizes base --processes 1 --skip_marian --deterministic
                       run deterministic 450 python3 benchmarks/gpu_check.py --parts training --deterministic $text \
                           --output_dir "$work/deterministic" ;;
    esac
done
wait
tar czf "$out/gpu_session.tgz" -C "$work" --exclude '*.arrow' --exclude '*.safetensors' --exclude '*.bin' \
    --exclude '*.pt' .
[ -f "$out/speed.log" ] && tail -40 "$out/speed.log"
echo "gpu_session: $((SECONDS - started)) s"
