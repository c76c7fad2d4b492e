#!/usr/bin/env bash
# The GPU check: one command on the device tool's offline H200 machine, in under 8 minutes.
#
#   bash benchmarks/gpu_wheels.sh            # HERE first (needs a registry): fills .whl/
#   bash benchmarks/gpu_check.sh             # THERE, through the device tool with carry [".whl"]
#   bash benchmarks/gpu_check.sh --dry-run   # here, on the CPU: the same steps, Triton interpreter, tiny
#
# That machine has Python 3.12 with its own torch (2.11+cu130), triton (3.6), numpy, transformers,
# pytest, hypothesis and pytest-timeout, no package registry, and not all of our dependencies. What it
# checks, in order (docs/kernels.md, "The GPU check"):
#   wheels        every pin of benchmarks/gpu_wheels.txt has its wheel in .whl/
#   install       those wheels, and nothing else, into /tmp/site (pip --no-index --no-deps --target), put
#                 on PYTHONPATH; the machine's own torch and triton are used. Dry run: the same install
#                 for cp312 into a scratch folder (the wheels are complete and install), not used here.
#   imports       every module of engine/, kernels/ and worker/ imports, and torch sees a GPU
#   cuda_tests    pytest -m cuda over the whole tests/ folder (collection must succeed without redis-server
#                 or the test-only tools); dry run: collection only. No test collected is a failure.
#   kernels       benchmarks/kernels.py: decode attention bandwidth and the split-count sweep
#   model         a random-weight checkpoint with the Qwen2.5-0.5B shapes, built on the CPU (8B: too slow)
#   gpu_e2e       benchmarks/gpu_e2e.py on it, Triton and torch attention, 32 requests of <= 256 prompt
#                 and 64 output tokens
#   gpu_e2e_cuda_graphs   the same with enable_cuda_graphs, Triton attention
#   gpu_e2e_async the same with async_scheduling, Triton attention
#   host_overhead benchmarks/host_overhead.py, few steps
#   simulated_device  host_overhead.py --device-ms 5, synchronous and async scheduling (a stand-in
#                 stream: what the host leaves idle, independent of this GPU)
#   gpu_e2e_tp2   tensor parallel 2 (only where >= 2 GPUs; that machine has one, so it reports why not)
# A failed install or import stops the run: later steps would only report the same missing module.
# Each step runs under `timeout` with its own limit, cut to what is left of the total budget. Logs and
# JSON go to a work folder; $OUT (set by the device tool, which brings back at most 8 files) receives
# summary.json and gpu_check.tar.gz with everything. Exit status 0 only when every step ran and passed.
set -uo pipefail
cd "$(dirname "$0")/.."

DRY_RUN=0
[[ "${1:-}" == "--dry-run" ]] && DRY_RUN=1
# The whole run, installs included: under 8 minutes with a margin. The dry run's interpreter on a shared
# 2-core machine is slower than the H200 run, so it gets more.
BUDGET_S="${GPU_CHECK_BUDGET_S:-$((DRY_RUN ? 900 : 450))}"
PY="${PYTHON:-python3}"
WORK="$(mktemp -d /tmp/gpu_check.XXXXXX)"
SITE=/tmp/site
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export TRITON_DEFAULT_FP_FUSION=1
((DRY_RUN)) && export TRITON_INTERPRET=1
MODELS=/tmp/conveyor-models  # random checkpoints gpu_e2e builds; local disk, gone with the machine
STEPS="$WORK/steps.tsv"
: >"$STEPS"
START=$(date +%s)
echo "gpu_check: work folder $WORK"

record() {  # name status seconds
    printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$STEPS"
    printf '%-22s %-44s %5ss\n' "$1" "$2" "$3"
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

finish() {  # summary.json (and the tarball into $OUT); exit 1 unless every step is ok or skipped by rule
    "$PY" - "$WORK" "$DRY_RUN" "$(($(date +%s) - START))" <<'EOF'
import json, sys
from pathlib import Path
work, dry, total = Path(sys.argv[1]), sys.argv[2] == "1", int(sys.argv[3])
steps = []
for line in (work / "steps.tsv").read_text().splitlines():
    name, status, seconds = line.split("\t")
    steps.append({"step": name, "status": status, "seconds": int(seconds)})
xml = work / "cuda_tests.xml"
if xml.exists():  # the pytest counts, and what was skipped and why
    import xml.etree.ElementTree as ET
    root = ET.parse(xml).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    counts = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    counts["skipped_because"] = sorted(
        {f"{case.get('name')}: {s.get('message')}" for case in suite.iter("testcase") for s in case.iter("skipped")}
    )
    (work / "cuda_tests.json").write_text(json.dumps(counts, indent=2))
env = json.loads((work / "environment.json").read_text()) if (work / "environment.json").exists() else {}
bad = [s["step"] for s in steps if not (s["status"] == "ok" or s["status"].startswith("skipped"))]
summary = {"dry_run": dry, "total_seconds": total, "all_ok": not bad, "not_ok": bad,
           "environment": env, "steps": steps}
(work / "summary.json").write_text(json.dumps(summary, indent=2))
print(f"{'every step ok' if not bad else 'NOT ok: ' + ', '.join(bad)}; {total} s; {work}/summary.json")
sys.exit(1 if bad else 0)
EOF
    local rc=$?
    if ((DRY_RUN)) && [[ -z "${OUT:-}" ]]; then
        cp "$WORK/summary.json" benchmarks/results/gpu_check-dry-run.json
    fi
    if [[ -n "${OUT:-}" ]]; then
        mkdir -p "$OUT"
        cp "$WORK/summary.json" "$OUT/"
        tar -czf "$OUT/gpu_check.tar.gz" -C "$WORK" .
    fi
    exit $rc
}

# --- wheels and install: nothing below may reach a registry ---
step wheels 10 "$PY" - <<'EOF' || finish
import re, sys
from pathlib import Path
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
pins = [l.strip() for l in Path("benchmarks/gpu_wheels.txt").read_text().splitlines()
        if l.strip() and not l.lstrip().startswith("#")]
have = {norm(w.name.split("-")[0]) + "-" + w.name.split("-")[1] for w in Path(".whl").glob("*.whl")}
missing = [p for p in pins if norm(p.split("==")[0]) + "-" + p.split("==")[1] not in have]
print(f"{len(pins)} pins, {len(have)} wheels in .whl/")
if missing:
    sys.exit(f"no wheel in .whl/ for {missing}: run `bash benchmarks/gpu_wheels.sh` on a machine with a "
             "registry and carry .whl")
EOF
if ((DRY_RUN)); then
    SITE="$WORK.site-cp312"  # beside the work folder: not packed into $OUT
    step install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
        --only-binary=:all: --python-version 3.12 --implementation cp "${PLATFORMS[@]}" \
        --target "$SITE" .whl/*.whl || finish
else
    step install 120 "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || finish
    export PYTHONPATH="$PWD:$SITE"
fi

# --- imports: any failure here is an error, never a skip ---
step imports 90 "$PY" - "$WORK/environment.json" "$DRY_RUN" <<'EOF' || finish
import importlib, json, pkgutil, platform, subprocess, sys
import numpy, torch, transformers, triton
dry = sys.argv[2] == "1"
info = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
        "numpy": numpy.__version__, "transformers": transformers.__version__, "cuda": torch.version.cuda,
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())], "dry_run": dry}
if not dry:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
json.dump(info, open(sys.argv[1], "w"), indent=2)
print(json.dumps(info, indent=2))
if not dry and not torch.cuda.is_available():
    sys.exit("torch sees no GPU (use --dry-run on a machine without one)")
failed = {}
for package in ("engine", "kernels", "worker"):
    root = importlib.import_module(package)
    for mod in pkgutil.walk_packages(root.__path__, package + "."):
        try:
            importlib.import_module(mod.name)
        except Exception as exc:  # noqa: BLE001 - every failure is reported, then the step fails
            failed[mod.name] = repr(exc)
print(f"imported engine, kernels, worker; {len(failed)} modules failed")
for name, why in failed.items():
    print(f"  {name}: {why}")
sys.exit(1 if failed else 0)
EOF
GPUS=$("$PY" -c "import torch; print(torch.cuda.device_count())")

# The checkpoint gpu_e2e loads: random weights and a byte-level BPE tokenizer made on the CPU (minutes on
# 2 cores, mostly the 152k-token tokenizer and the bf16 init), in the background while the CUDA tests and
# the kernel benchmark keep the GPU busy; gpu_e2e waits for it. The dry run builds gpu_e2e's tiny one.
step model 200 "$PY" - "$MODELS" "$DRY_RUN" <<'EOF' &
import sys
from pathlib import Path
from benchmarks.gpu_e2e import TINY
from benchmarks.workload import SHAPES, bench_model_dir
arch, dims = SHAPES["qwen2.5-0.5b"]
print(bench_model_dir(Path(sys.argv[1]), arch, **(TINY if sys.argv[2] == "1" else dims)))
EOF
MODEL_PID=$!

# --- CUDA tests; pytest's exit 5 (nothing collected) fails like any other non-zero status ---
if ((DRY_RUN)); then
    step cuda_tests 240 "$PY" -m pytest -q -m cuda tests -p no:cacheprovider --collect-only
else
    step cuda_tests 150 "$PY" -m pytest -q -rs -m cuda tests -p no:cacheprovider \
        --junitxml="$WORK/cuda_tests.xml"
fi

# --- benchmarks, bounded: the 0.5B shapes only, on the checkpoint the model step built ---
E2E=(--shapes qwen2.5-0.5b --num-requests 32 --max-prompt 256 --max-output 64 --max-batch 32
    --kv-blocks 2048 --model-cache "$MODELS")
if ((DRY_RUN)); then
    step kernels 150 "$PY" benchmarks/kernels.py --dry-run --out "$WORK/kernels.json"
else
    step kernels 90 "$PY" benchmarks/kernels.py --iters 10 --out "$WORK/kernels.json"
fi
if ! wait "$MODEL_PID"; then
    record gpu_e2e "not run: no checkpoint (model step)" 0
    record gpu_e2e_cuda_graphs "not run: no checkpoint (model step)" 0
elif ((DRY_RUN)); then
    step gpu_e2e 150 "$PY" benchmarks/gpu_e2e.py --dry-run "${E2E[@]}" --out "$WORK/gpu_e2e.json"
    skip gpu_e2e_cuda_graphs "dry run: CUDA graphs need a GPU"
    step gpu_e2e_async 150 "$PY" benchmarks/gpu_e2e.py --dry-run "${E2E[@]}" --backends torch \
        --async-scheduling --out "$WORK/gpu_e2e_async.json"
else
    step gpu_e2e 100 "$PY" benchmarks/gpu_e2e.py "${E2E[@]}" --out "$WORK/gpu_e2e.json"
    step gpu_e2e_cuda_graphs 60 "$PY" benchmarks/gpu_e2e.py "${E2E[@]}" --backends triton \
        --enable-cuda-graphs --out "$WORK/gpu_e2e_cuda_graphs.json"
    step gpu_e2e_async 60 "$PY" benchmarks/gpu_e2e.py "${E2E[@]}" --backends triton \
        --async-scheduling --out "$WORK/gpu_e2e_async.json"
fi
if ((DRY_RUN)); then
    step host_overhead 120 "$PY" benchmarks/host_overhead.py --dry-run --out "$WORK/host_overhead.json"
    for mode in sync async; do
        flag=$([[ $mode == async ]] && echo --async-scheduling)
        step "simulated_device_$mode" 120 "$PY" benchmarks/host_overhead.py --dry-run --device-ms 5 $flag \
            --json "$WORK/simulated_device_$mode.json"
    done
else
    step host_overhead 60 "$PY" benchmarks/host_overhead.py --steps 10 --warmup 2 \
        --out "$WORK/host_overhead.json"
    for mode in sync async; do
        flag=$([[ $mode == async ]] && echo --async-scheduling)
        step "simulated_device_$mode" 60 "$PY" benchmarks/host_overhead.py --device-ms 5 --steps 20 \
            --warmup 2 $flag --json "$WORK/simulated_device_$mode.json"
    done
fi
if ((GPUS < 2)); then
    skip gpu_e2e_tp2 "needs 2 GPUs, this machine has $GPUS"
else
    step gpu_e2e_tp2 90 "$PY" benchmarks/gpu_e2e.py "${E2E[@]}" --backends triton \
        --tensor-parallel-size 2 --out "$WORK/gpu_e2e_tp2.json"
fi
finish
