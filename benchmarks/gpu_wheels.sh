#!/usr/bin/env bash
# Run HERE (a machine with a package registry), before benchmarks/gpu_check.sh runs on the offline GPU
# machine: downloads benchmarks/gpu_wheels.txt as cp312 manylinux x86-64 wheels into .whl/ (git-ignored,
# carried by the device tool's `carry: [".whl"]`). No dependency resolution (--no-deps): the list names
# every package the GPU machine lacks, so what is installed there is exactly what is listed.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl
mkdir -p "$DEST"
mapfile -t PINS < <(grep -Ev '^\s*(#|$)' benchmarks/gpu_wheels.txt)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DEST" "${PINS[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# Wheels of older pins left in .whl/ would put two versions of one package in the install there.
python3 - "$DEST" "${PINS[@]}" <<'PY'
import re, sys
from pathlib import Path
dest, pins = Path(sys.argv[1]), sys.argv[2:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
wanted = {norm(n) + "-" + v for n, v in (p.split("==") for p in pins)}
for whl in sorted(dest.glob("*.whl")):
    name, version = whl.name.split("-")[:2]
    if norm(name) + "-" + version not in wanted:
        print(f"removing {whl.name}: not in benchmarks/gpu_wheels.txt")
        whl.unlink()
PY
du -ch "$DEST"/*.whl | tail -1
ls "$DEST"
