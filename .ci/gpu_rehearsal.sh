#!/usr/bin/env bash
# The GPU check rehearsed on the CPU, in a venv holding only packages the lent GPU machine has
# (benchmarks/gpu_machine_packages.txt) plus the wheels the check carries, installed exactly as
# benchmarks/gpu_check.sh installs them there (--no-index --no-deps --target, on PYTHONPATH). Then
# `gpu_check.sh --dry-run`: imports, CUDA-test collection, and every step that can start without a GPU.
# A missing wheel or a module failing to import fails it.
#
# Stand-ins: the CPU torch 2.13.0 (on this disk) for the machine's torch 2.11+cu130, triton 3.6.0 as there,
# and this machine's Python 3.11 for its 3.12, so the rehearsal downloads cp311 wheels for itself
# (gpu_wheels.sh --python-version 3.11); the real run carries cp312 ones (.whl/).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${GPU_REHEARSAL_VENV:-/tmp/gpu-rehearsal}"
WHEELS="${GPU_REHEARSAL_WHEELS:-/tmp/gpu-rehearsal-wheels}"
# What Conveyor's imports, its CUDA tests and the check's steps reach, each on the machine's list; its
# version where that list gives one and this registry has it for Python 3.11. numpy: below 2.4, since
# triton 3.6's interpreter (the dry run's kernels) fails under numpy 2.4+ ("only 0-dimensional arrays can
# be converted to Python scalars"); on the GPU the kernels are compiled, and the machine's numpy 2.5 is
# fine. pip resolves their needs; every package it installs is checked against the list.
PACKAGES=(
    torch==2.13.0 triton==3.6.0 transformers==5.17.0 tokenizers==0.23.2 safetensors==0.8.0
    huggingface-hub==1.33.0 "numpy>=2,<2.4" click prometheus-client rich tqdm uvloop anyio h11 annotated-doc
    pytest hypothesis pytest-timeout pyyaml requests
    matplotlib # benchmarks/article.py --quick draws its charts
    # ... and python-dateutil from 4.0 needs tzdata, which the machine's list lacks: the 2.9 it can have.
    "python-dateutil<3"
    # huggingface-hub's CLI needs typer; from 0.29 typer needs pydantic, which the machine lacks (so its
    # typer is older): pydantic must come from the carried wheels, as there.
    "typer<0.29"
)

rm -rf "$VENV"
python3 -m venv "$VENV" # no system site packages: only what is installed below
"$VENV/bin/python" -m pip install -q "${PACKAGES[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# -I: the checkout (cwd) off sys.path, or an editable install's conveyor.egg-info there would count.
"$VENV/bin/python" -I - benchmarks/gpu_machine_packages.txt <<'PY'
import re, sys
from importlib.metadata import distributions
norm = lambda s: re.sub(r"[-_.]+", "-", s).lower()
lines = [l.strip() for l in open(sys.argv[1])]
machine = {norm(l.split("==")[0]) for l in lines if l and not l.startswith("#")}
extra = sorted({norm(d.metadata["Name"]) for d in distributions()} - machine)
if extra:
    sys.exit(f"the rehearsal venv holds packages the GPU machine does not: {extra}")
print("rehearsal venv: every package is on the GPU machine's list")
PY
bash benchmarks/gpu_wheels.sh --python-version 3.11 --dest "$WHEELS"
unset PYTHONPATH
PYTHON="$VENV/bin/python" GPU_CHECK_WHEELS="$WHEELS" bash benchmarks/gpu_check.sh --dry-run
