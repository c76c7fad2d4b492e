#!/usr/bin/env bash
# Run HERE (a machine with a package registry), before benchmarks/gpu_check.sh runs on the offline GPU
# machine: downloads benchmarks/gpu_wheels.txt as manylinux x86-64 wheels (no dependency resolution:
# the list names every package that machine lacks) into a git-ignored folder.
#
#   bash benchmarks/gpu_wheels.sh                         # cp312 into .whl/: what the GPU machine runs
#   bash benchmarks/gpu_wheels.sh --python-version 3.11 --dest /tmp/whl311   # for a 3.11 rehearsal venv
#
# The GPU machine's Python is 3.12, so the wheels carried there (.whl/, `carry: [".whl"]`) are cp312;
# .ci/gpu_rehearsal.sh runs in this machine's Python 3.11 and downloads cp311 ones for itself.
set -euo pipefail
cd "$(dirname "$0")/.."
PYVER=3.12
DEST=.whl
while (($#)); do
    case "$1" in
        --python-version) PYVER="$2"; shift 2 ;;
        --dest) DEST="$2"; shift 2 ;;
        *) echo "usage: $0 [--python-version X.Y] [--dest DIR]" >&2; exit 2 ;;
    esac
done
mkdir -p "$DEST"
mapfile -t PINS < <(grep -Ev '^\s*(#|$)' benchmarks/gpu_wheels.txt)
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYVER" --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$DEST" "${PINS[@]}" \
    2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# Wheels of older pins (or of another Python) left in the folder would put two versions of one package in
# the install there.
python3 - "$DEST" "$PYVER" "${PINS[@]}" <<'PY'
import re, sys
from pathlib import Path
dest, pyver, pins = Path(sys.argv[1]), sys.argv[2], sys.argv[3:]
norm = lambda s: re.sub(r"[-_.]+", "_", s).lower()
wanted = {norm(n) + "-" + v for n, v in (p.split("==") for p in pins)}
tag = "cp" + pyver.replace(".", "")
for whl in sorted(dest.glob("*.whl")):
    name, version, py = whl.name.split("-")[:3]
    if norm(name) + "-" + version not in wanted or (py.startswith("cp") and py != tag):
        print(f"removing {whl.name}: not a {tag} wheel of benchmarks/gpu_wheels.txt")
        whl.unlink()
PY
du -ch "$DEST"/*.whl | tail -1
