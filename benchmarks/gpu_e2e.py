"""End-to-end output tokens/s on a GPU: the same seeded workload through LLMEngine with the Triton and
the torch attention backends (bf16), in the style of benchmarks/throughput.py.

    python benchmarks/gpu_e2e.py                                # CUDA: Qwen2.5-0.5B and Llama-8B shapes
    python benchmarks/gpu_e2e.py --shapes qwen2.5-0.5b          # one shape
    python benchmarks/gpu_e2e.py --dry-run                      # CPU, fp32, Triton interpreter, tiny
    python benchmarks/gpu_e2e.py --enable-cuda-graphs --backends triton   # when the engine has the option
    python benchmarks/gpu_e2e.py --tensor-parallel-size 2        # when the engine has the option

Models are random weights with the shapes of the published ones (benchmarks/workload.py SHAPES), made
once under --model-cache; the 8B one takes ~16 GB of disk and a few minutes to write.

Writes JSON to --out (default benchmarks/results/gpu_e2e.json, gpu_e2e-dry-run.json for --dry-run),
rewritten after each shape so a run cut short keeps what it finished.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:  # must precede any triton kernel import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import SHAPES, bench_engine, bench_model_dir, make_workload  # noqa: E402
from engine import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512)


def engine_options() -> set[str]:
    """Option names the engine accepts (EngineConfig fields), to pass newer options only when they exist."""
    from dataclasses import fields

    from engine.config import EngineConfig

    return {f.name for f in fields(EngineConfig)}


def run(model_dir: Path, jobs, backend: str, a: argparse.Namespace) -> dict:
    extra = {}
    if a.enable_cuda_graphs:
        extra["enable_cuda_graphs"] = True
    if a.tensor_parallel_size > 1:
        extra["tensor_parallel_size"] = a.tensor_parallel_size
    if a.async_scheduling:
        extra["async_scheduling"] = True
    missing = set(extra) - engine_options()
    if missing:
        raise SystemExit(f"this engine has no option {sorted(missing)}")
    engine = bench_engine(model_dir, a, dtype=a.dtype, device=a.device, attention_backend=backend, **extra)
    for i, job in enumerate(jobs):
        params = SamplingParams(max_tokens=job.max_tokens, temperature=0, ignore_eos=True)
        engine.add_request(f"r{i}", job.prompt_token_ids, params)
    tokens: dict[str, list[int]] = {}
    start = time.perf_counter()
    try:
        while engine.has_unfinished_requests():
            for d in engine.step():
                tokens.setdefault(f"{d.request_id}/{d.sample_index}", []).extend(d.new_token_ids)
        if a.device == "cuda":
            torch.cuda.synchronize()
        elapsed = time.perf_counter() - start
    finally:
        if hasattr(engine, "close"):  # tensor parallelism: stop the ranks before the next engine starts
            engine.close()
    produced = sum(len(t) for t in tokens.values())
    return {
        "output_tokens": produced,
        "seconds": elapsed,
        "tokens_per_s": produced / elapsed,
        "tokens": tokens,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--max-prompt", type=int, default=512)
    p.add_argument("--max-output", type=int, default=512)
    p.add_argument("--max-batch", type=int, default=64)
    p.add_argument("--max-batched-tokens", type=int, default=4096)
    p.add_argument("--kv-blocks", type=int, default=8192)
    p.add_argument("--backends", default="triton,torch")
    p.add_argument("--shapes", default="qwen2.5-0.5b,llama-8b", help="comma-separated: " + ",".join(SHAPES))
    p.add_argument("--dry-run", action="store_true")
    p.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "conveyor")
    p.add_argument("--enable-cuda-graphs", action="store_true", help="engine option enable_cuda_graphs=True")
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--async-scheduling", action="store_true", help="engine option async_scheduling=True")
    p.add_argument("--out", type=Path, default=None)
    a = p.parse_args()
    a.device, a.dtype = ("cpu", "float32") if a.dry_run else ("cuda", "bfloat16")
    if a.dry_run:
        a.num_requests, a.max_prompt, a.max_output, a.max_batch, a.kv_blocks = 2, 20, 2, 2, 16
    torch.manual_seed(0)
    report = {}
    out = a.out or RESULTS / ("gpu_e2e-dry-run.json" if a.dry_run else "gpu_e2e.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    for shape in a.shapes.split(","):
        arch, dims = SHAPES[shape]
        # The interpreter is slow: a dry run uses a tiny model of the same architecture.
        model_dir = bench_model_dir(a.model_cache, arch, **(TINY if a.dry_run else dims))
        report[shape] = run_shape(model_dir, shape, a)
        out.write_text(
            json.dumps({"args": {k: str(v) for k, v in vars(a).items()}, "results": report}, indent=2)
        )
        print(f"wrote {out}")


def run_shape(model_dir: Path, shape: str, a: argparse.Namespace) -> dict:
    vocab_size = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    jobs = make_workload(
        a.num_requests,
        min_prompt=min(16, a.max_prompt),
        max_prompt=a.max_prompt,
        max_output=a.max_output,
        vocab_size=vocab_size,
    )
    results = {}
    for backend in a.backends.split(","):
        results[backend] = run(model_dir, jobs, backend, a)
        print(
            f"{shape} {backend}: {results[backend]['tokens_per_s']:.1f} output tok/s "
            f"in {results[backend]['seconds']:.1f} s"
        )
    if len(results) > 1:
        # Greedy decoding: backends should agree token for token (bf16 may flip rare near-ties).
        first = next(iter(results.values()))["tokens"]
        same = {b: sum(r["tokens"][k] == first[k] for k in first) / len(first) for b, r in results.items()}
        print(f"{shape}: share of requests with identical tokens vs {next(iter(results))}: {same}")
        results["identical_share"] = same
    for r in results.values():
        if isinstance(r, dict):
            r.pop("tokens", None)
    return results


if __name__ == "__main__":
    main()
