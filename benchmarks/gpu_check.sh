#!/usr/bin/env bash
# Everything to run when a GPU machine is lent, in one command, in under 8 minutes on one H200:
#
#   benchmarks/gpu_check.sh              # CUDA: installs what is missing, then each step below
#   benchmarks/gpu_check.sh --dry-run    # CPU: the same sequence, Triton interpreter and tiny shapes;
#                                        # CUDA-only steps report "skipped: no GPU"
#
# Steps: CUDA tests (pytest -m cuda), benchmarks/kernels.py, benchmarks/gpu_e2e.py without and with CUDA
# graphs (with: only when EngineConfig has enable_cuda_graphs), benchmarks/host_overhead.py (when it
# exists), and a TP=2 gpu_e2e run (only with >= 2 GPUs and an engine with tensor_parallel_size).
# Each step runs under `timeout` (its own limit, cut to what is left of the total budget), so one hung
# step cannot eat the rest. Every result is JSON under $OUT (set by the device tool; default
# benchmarks/results/gpu_check/), with each step's log, and $OUT/summary.json lists every step's status
# and wall time. The exit status is 0 only when no step failed or timed out.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
OUT="${OUT:-benchmarks/results/gpu_check}"
BUDGET_S="${GPU_CHECK_BUDGET_S:-470}"  # the whole run, installs included: 8 minutes with a margin
PY="${PYTHON:-python3}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_DEFAULT_FP_FUSION=1
STEPS="$OUT/steps.tsv"
: >"$STEPS"
START=$(date +%s)

record() {  # name status seconds result-file
    printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$STEPS"
    printf '%-22s %-40s %5ss\n' "$1" "$2" "$3"
}

# step NAME LIMIT_S RESULT_FILE CMD...: run CMD under timeout, its output in $OUT/NAME.log.
step() {
    local name="$1" limit="$2" result="$3"
    shift 3
    local left=$((BUDGET_S - ($(date +%s) - START)))
    if ((left < 15)); then
        record "$name" "skipped: total budget spent" 0 ""
        return
    fi
    ((limit > left)) && limit=$left
    local t0 rc status
    t0=$(date +%s)
    timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
    rc=$?
    case $rc in
        0) status="ok" ;;
        124 | 137) status="timeout after ${limit}s" ;;
        *) status="failed (exit $rc)" ;;
    esac
    record "$name" "$status" $(($(date +%s) - t0)) "$result"
}

skip() { record "$1" "skipped: $2" 0 ""; }

has_engine_option() {  # EngineConfig field present in this checkout?
    "$PY" -c "import dataclasses, sys; from engine.config import EngineConfig as C; \
sys.exit(0 if '$1' in {f.name for f in dataclasses.fields(C)} else 1)" 2>/dev/null
}

gpu_count() { nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true; }

GPUS=$(gpu_count)
GRAPHS="engine has no enable_cuda_graphs option"
has_engine_option enable_cuda_graphs && GRAPHS="engine has enable_cuda_graphs"
TP="engine has no tensor_parallel_size option"
has_engine_option tensor_parallel_size && TP="engine has tensor_parallel_size"
if ((DRY_RUN)); then
    skip install "dry run"
elif "$PY" -c "import torch, triton, pytest, engine; assert torch.cuda.is_available()" 2>/dev/null; then
    skip install "torch with CUDA, triton and the package already importable"
else
    # Plain `pip install torch` is the CUDA build on a Linux GPU machine.
    step install 240 "" bash -c "$PY -m pip install -q torch && $PY -m pip install -q -e '.[test]'"
fi

"$PY" - "$OUT/environment.json" "$DRY_RUN" <<'EOF' >/dev/null 2>&1 || true
import json, platform, subprocess, sys
info = {"python": platform.python_version(), "machine": platform.machine(), "dry_run": sys.argv[2] == "1"}
try:
    import torch, triton
    info.update(torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda,
                gpus=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])
except Exception as exc:
    info["import_error"] = repr(exc)
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
except OSError:
    info["nvidia_smi"] = None
json.dump(info, open(sys.argv[1], "w"), indent=2)
EOF

if ((DRY_RUN)) || ((GPUS == 0)); then
    skip cuda_tests "no GPU"
else
    step cuda_tests 100 cuda_tests.xml \
        "$PY" -m pytest -q -m cuda tests -p no:cacheprovider --junitxml="$OUT/cuda_tests.xml"
fi

if ((DRY_RUN)); then
    step kernels 120 kernels.json "$PY" benchmarks/kernels.py --dry-run --out "$OUT/kernels.json"
    step gpu_e2e 120 gpu_e2e.json "$PY" benchmarks/gpu_e2e.py --dry-run --shapes qwen2.5-0.5b \
        --out "$OUT/gpu_e2e.json"
    skip gpu_e2e_cuda_graphs "no GPU ($GRAPHS)"
elif ((GPUS == 0)); then
    skip kernels "no GPU"
    skip gpu_e2e "no GPU"
    skip gpu_e2e_cuda_graphs "no GPU"
else
    step kernels 75 kernels.json "$PY" benchmarks/kernels.py --out "$OUT/kernels.json"
    step gpu_e2e 150 gpu_e2e.json "$PY" benchmarks/gpu_e2e.py --out "$OUT/gpu_e2e.json"
    if [[ "$GRAPHS" == "engine has enable_cuda_graphs" ]]; then
        step gpu_e2e_cuda_graphs 90 gpu_e2e_cuda_graphs.json "$PY" benchmarks/gpu_e2e.py --backends triton \
            --enable-cuda-graphs --out "$OUT/gpu_e2e_cuda_graphs.json"
    else
        skip gpu_e2e_cuda_graphs "$GRAPHS"
    fi
fi

if [[ ! -f benchmarks/host_overhead.py ]]; then
    skip host_overhead "benchmarks/host_overhead.py not in this checkout"
else
    # Its flags are another helper's: pass --out / --dry-run only if its --help lists them.
    HELP=$("$PY" benchmarks/host_overhead.py --help 2>/dev/null || true)
    ARGS=()
    [[ "$HELP" == *--out* ]] && ARGS+=(--out "$OUT/host_overhead.json")
    ((DRY_RUN)) && [[ "$HELP" == *--dry-run* ]] && ARGS+=(--dry-run)
    step host_overhead 60 host_overhead.json "$PY" benchmarks/host_overhead.py "${ARGS[@]}"
fi

if ((GPUS < 2)); then
    skip gpu_e2e_tp2 "needs >= 2 GPUs, found $GPUS ($TP)"
elif [[ "$TP" != "engine has tensor_parallel_size" ]]; then
    skip gpu_e2e_tp2 "$TP"
else
    step gpu_e2e_tp2 90 gpu_e2e_tp2.json "$PY" benchmarks/gpu_e2e.py --backends triton --shapes qwen2.5-0.5b \
        --tensor-parallel-size 2 --out "$OUT/gpu_e2e_tp2.json"
fi

"$PY" - "$OUT" "$DRY_RUN" "$(($(date +%s) - START))" <<'EOF'
import json, os, sys
from pathlib import Path
out, dry, total = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
steps = []
for line in (out / "steps.tsv").read_text().splitlines():
    name, status, seconds, result = line.split("\t")
    entry = {"step": name, "status": status, "seconds": int(seconds)}
    if result and (out / result).exists():
        entry["result"] = result
    if (out / f"{name}.log").exists():
        entry["log"] = f"{name}.log"
    steps.append(entry)
xml = out / "cuda_tests.xml"
if xml.exists():  # the pytest counts as JSON too
    import xml.etree.ElementTree as ET
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    (out / "cuda_tests.json").write_text(json.dumps(counts, indent=2))
env = json.loads((out / "environment.json").read_text()) if (out / "environment.json").exists() else {}
bad = [s["step"] for s in steps if not (s["status"] == "ok" or s["status"].startswith("skipped"))]
summary = {"dry_run": dry, "total_seconds": total, "all_ok": not bad, "not_ok": bad,
           "environment": env, "steps": steps}
(out / "summary.json").write_text(json.dumps(summary, indent=2))
print(f"{'all steps ok or skipped' if not bad else 'NOT ok: ' + ', '.join(bad)}; {total} s; {out}/summary.json")
sys.exit(1 if bad else 0)
EOF
