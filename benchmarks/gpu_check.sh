#!/usr/bin/env bash
# The GPU check: one command on the device tool's offline GPU machine (one H100 or H200), in under 8 minutes.
#
#   bash benchmarks/gpu_wheels.sh            # HERE first (needs a registry): cp312 wheels into .whl/
#   bash benchmarks/gpu_model_parts.sh       # HERE: the real model in two parts under .gpu_model/
#   device call 1: carry [".gpu_model/1"], command `true`; then call 2, on the same warm machine:
#   bash benchmarks/gpu_check.sh             # THERE, carry [".gpu_model/2", ".whl"]
#   bash benchmarks/gpu_check.sh --dry-run   # on a CPU: the steps that can start there; interpreter, tiny
#
# That machine has Python 3.12 with its own torch (2.11+cu130), triton (3.6), numpy, transformers, pytest,
# hypothesis and pytest-timeout (benchmarks/gpu_machine_packages.txt), no package registry, and not all of
# our dependencies. Steps, in order (docs/kernels.md, "The GPU check"); correctness before speed, so a run
# cut short keeps the most valuable answers:
#   wheels        every pin of benchmarks/gpu_wheels.txt has its wheel in $GPU_CHECK_WHEELS (.whl/), and
#                 every wheel's own needs are pinned or on the machine (benchmarks/gpu_wheels_check.py)
#   install       those wheels, and nothing else, into a scratch site (pip --no-index --no-deps --target),
#                 put on PYTHONPATH; the machine's own torch and triton are used
#   imports       every module of engine/, kernels/ and worker/ imports (benchmarks/gpu_imports.py)
#   model_file    the real model reassembled from .gpu_model/*/ and its SHA-256 checked (skipped: no parts)
#   model         (background, CPU) a random-weight checkpoint with Qwen2.5-0.5B's shapes; dry run: tiny
#   cuda_tests    pytest -m cuda over the folders that hold CUDA tests (CUDA_TEST_DIRS; dry run: collection
#                 only). No test collected is a failure
#   tokens        greedy tokens of eager, CUDA-graph and async engines against transformers' generate, bf16
#   tokens_real   the same on the real model, when carried and when this tree loads .gguf files
#   kernels       benchmarks/kernels.py: decode attention bandwidth as a share of copy bandwidth, split sweep
#   speed         benchmarks/gpu_e2e.py --part speed: tokens/s, first-token latency, step vs forward time,
#                 against transformers' generate and generate_batch on the same 256 prompts
#   article       benchmarks/article.py --quick: static vs continuous, reserve_max vs paged, the knobs, on the
#                 real model when carried (else tiny), JSON and charts
#   tp2           tensor parallel 2: only where >= 2 GPUs (this machine has one: reports why not)
# Nothing that only needs a CPU runs here (host_overhead.py and the simulated device run on any CPU).
# A failed install or import stops the run. Each step runs under `timeout` with its own limit, cut to what
# is left of the total budget. $OUT (set by the device tool) receives summary.json (every figure) and
# gpu_check.tar.gz (logs and JSONs). Exit status 0 only when every step ran and passed or was skipped by rule.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
# The whole run, installs included: 8 minutes less the machine's start. The dry run on a shared 2-core
# machine runs the interpreter, so it gets more.
BUDGET_S="${GPU_CHECK_BUDGET_S:-$((DRY_RUN ? 600 : 450))}"
PY="${PYTHON:-python3}"
WHEELS="${GPU_CHECK_WHEELS:-.whl}"
WORK="$(mktemp -d /tmp/gpu_check.XXXXXX)"
SITE="$WORK.site" # beside the work folder: not packed into $OUT
MODELS=/tmp/conveyor-models # random checkpoints and the reassembled GGUF; local disk, gone with the machine
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
CUDA_TEST_DIRS=(tests/kernels tests/quant tests/engine) # every `cuda`-marked test lives here (tests/benchmarks/test_gpu_check.py)
export PYTHONPATH="$PWD"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TRITON_DEFAULT_FP_FUSION=1
((DRY_RUN)) && export TRITON_INTERPRET=1
DRY=()
((DRY_RUN)) && DRY=(--dry-run)
STEPS="$WORK/steps.tsv"
: >"$STEPS"
START=$(date +%s)
echo "gpu_check: work folder $WORK"

record() { # name status seconds
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$STEPS"
    printf '%-14s %-52s %5ss\n' "$1" "$2" "$3"
}

# step NAME LIMIT_S CMD...: run CMD under timeout, its output in $WORK/NAME.log; returns CMD's status.
step() {
    local name="$1" limit="$2"
    shift 2
    local left=$((BUDGET_S - ($(date +%s) - START)))
    if ((left < 15)); then
        record "$name" "not run: total budget spent" 0
        return 1
    fi
    ((limit > left)) && limit=$left
    local t0 rc status
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$WORK/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status="ok" ;;
        124 | 137) status="timeout after ${limit}s" ;;
        *) status="failed (exit $rc)" ;;
    esac
    record "$name" "$status" $(($(date +%s) - t0))
    ((rc != 0)) && tail -n 25 "$WORK/$name.log" | sed "s/^/    $name| /"
    return $rc
}

skip() { record "$1" "skipped: $2" 0; }

finish() { # summary.json (every figure) and the tarball into $OUT; exit 1 unless every step is ok or skipped
    "$PY" benchmarks/gpu_summary.py "$WORK" "$DRY_RUN" "$(($(date +%s) - START))"
    local rc=$?
    if [[ -n "${OUT:-}" ]]; then
        mkdir -p "$OUT"
        cp "$WORK/summary.json" "$OUT/"
        tar -czf "$OUT/gpu_check.tar.gz" -C "$WORK" .
    fi
    exit $rc
}

# --- wheels and install: nothing below may reach a registry ---
step wheels 20 "$PY" -m benchmarks.gpu_wheels_check "$WHEELS" || finish
step install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "$WHEELS"/*.whl || finish
export PYTHONPATH="$PWD:$SITE"

# --- imports: any failure here is an error, never a skip ---
step imports 90 "$PY" -m benchmarks.gpu_imports "$WORK/environment.json" "${DRY[@]}" || finish
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")

# --- the real model: reassembled from the parts the two device calls carried ---
GGUF=""
parts=(.gpu_model/*/"$GGUF_NAME.part")
if [[ ! -e "${parts[0]}" ]]; then
    skip model_file "no .gpu_model/*/$GGUF_NAME.part carried"
elif step model_file 30 bash -c 'mkdir -p "$1" && cat "${@:4}" >"$1/$2" && echo "$3  $1/$2" | sha256sum -c' \
    _ "$MODELS" "$GGUF_NAME" "$GGUF_SHA256" "${parts[@]}"; then
    GGUF="$MODELS/$GGUF_NAME"
fi

# The checkpoint the tokens and speed steps load: random weights and a byte-level BPE tokenizer, made on
# the CPU in the background while the CUDA tests keep the GPU busy. A dry run makes a tiny one.
step model 200 "$PY" - "$MODELS" "$DRY_RUN" <<'PY' &
import sys
from pathlib import Path
from benchmarks.gpu_e2e import TINY
from benchmarks.workload import SHAPES, bench_model_dir
arch, dims = SHAPES["qwen2.5-0.5b"]
print(bench_model_dir(Path(sys.argv[1]), arch, **(TINY if sys.argv[2] == "1" else dims)))
PY
MODEL_PID=$!

# --- correctness: the CUDA kernel tests (pytest's exit 5, nothing collected, fails like any other) ---
if ((DRY_RUN)); then
    step cuda_tests 120 "$PY" -m pytest -q -m cuda "${CUDA_TEST_DIRS[@]}" -p no:cacheprovider --collect-only
else
    step cuda_tests 90 "$PY" -m pytest -q -rs -m cuda "${CUDA_TEST_DIRS[@]}" -p no:cacheprovider \
        --junitxml="$WORK/cuda_tests.xml"
fi

# --- correctness: the engine's greedy tokens against transformers' generate ---
MODEL=""
if wait "$MODEL_PID"; then
    MODEL=$(tail -n 1 "$WORK/model.log")
    step tokens 90 "$PY" benchmarks/gpu_e2e.py --part tokens "${DRY[@]}" --model "$MODEL" \
        --out "$WORK/tokens.json"
else
    record tokens "not run: no checkpoint (model step)" 0
fi
if [[ -z "$GGUF" ]]; then
    skip tokens_real "no real model (model_file step)"
elif ! "$PY" -c "import engine.gguf_files" 2>/dev/null; then
    skip tokens_real "not run: this tree cannot load GGUF"
elif ((DRY_RUN)); then
    skip tokens_real "dry run: its 30 layers under the interpreter take too long"
else
    step tokens_real 120 "$PY" benchmarks/gpu_e2e.py --part tokens --model "$GGUF" --out "$WORK/tokens_real.json"
fi

# --- speed, warm ---
step kernels 60 "$PY" benchmarks/kernels.py "${DRY[@]}" --iters 10 --out "$WORK/kernels.json"
if [[ -n "$MODEL" ]]; then
    step speed 150 "$PY" benchmarks/gpu_e2e.py --part speed "${DRY[@]}" --model "$MODEL" --out "$WORK/speed.json"
else
    record speed "not run: no checkpoint (model step)" 0
fi
step article 90 env CONVEYOR_CACHE="$MODELS" "$PY" benchmarks/article.py --quick --device auto \
    --model "${GGUF:-tiny}" --out-dir "$WORK/article"
if ((GPUS < 2)); then
    skip tp2 "needs 2 GPUs, this machine has $GPUS"
else
    step tp2 60 "$PY" benchmarks/gpu_e2e.py --part tokens --model "$MODEL" --modes eager \
        --tensor-parallel-size 2 --out "$WORK/tp2.json"
fi
finish
