"""Where Conveyor's time goes on a throughput workload: torch.profiler's top operators by self CPU time.

    python benchmarks/profile_throughput.py --workload decode [--num-requests 32] [--threads N] [--top 20]

Runs the workload's first requests through one LLMEngine (greedy, ignore_eos) under the profiler and
prints the table; writes it to benchmarks/results/profile-<workload>.txt. Then, for the matmul shapes
that took the most time, the engine's time per call beside the three MFU baselines for the
same shape (benchmarks/gemm_baseline.py): which of them the engine's matmuls run at. The profiler adds a
few microseconds to every call, so the engine's figure is a little high for the shortest products.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.gemm_baseline import WeightStream, last_level_cache_bytes, streamed_calls, time_gemm  # noqa: E402
from benchmarks.mfu import flops  # noqa: E402
from benchmarks.workload import WORKLOADS, bench_engine, bench_model_dir  # noqa: E402
from engine import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="decode")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--top", type=int, default=20, help="rows of each table")
    p.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "conveyor")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    w = WORKLOADS[a.workload]
    a.max_batch, a.max_batched_tokens, a.kv_blocks = w.max_batch, 2048, 4096
    jobs = w.jobs()[: a.num_requests]
    engine = bench_engine(bench_model_dir(a.model_cache), a, dtype="float32", device="cpu")
    warm = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine.generate([jobs[0].prompt_token_ids], warm)
    for i, job in enumerate(jobs):
        engine.add_request(
            f"r{i}",
            job.prompt_token_ids,
            SamplingParams(max_tokens=job.max_tokens, temperature=0, ignore_eos=True),
        )
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        while engine.has_unfinished_requests():
            engine.step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top)
    # The same by input shape: which matmul shapes the time goes to.
    shapes = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=a.top
    )
    table = f"{table}\nBy input shape:\n{shapes}\n{mm_against_baselines(prof, a.top)}"
    print(table)
    out = RESULTS / f"profile-{a.workload}.txt"
    out.write_text(f"{a.num_requests} requests of {a.workload}, {a.threads} torch threads\n{table}\n")
    print(f"wrote {out}")


def mm_against_baselines(prof, top: int) -> str:
    """The `top` aten::mm shapes by total time: the engine's microseconds per call (self CPU time) and the
    three baselines' for the same [M, K] x [K, N], fp32."""
    mms = [
        e
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::mm" and len(e.input_shapes) >= 2 and len(e.input_shapes[0]) == 2
    ]
    mms = sorted(mms, key=lambda e: e.self_cpu_time_total, reverse=True)[:top]
    cache = last_level_cache_bytes()
    lines = [
        "aten::mm: engine against the baselines of benchmarks/gemm_baseline.py, microseconds per call (GFLOP/s)",
        f"{'M x K x N':>18} {'calls':>6} {'engine':>16} {'warm':>16} {'streamed':>16} {'streamed_nk':>16}",
    ]
    for e in mms:
        (m, k), (_, n) = e.input_shapes[0], e.input_shapes[1]
        shape = (m, k, n)
        engine = e.self_cpu_time_total / e.count * 1e-6
        warm = time_gemm(shape, torch.float32)[0]
        streamed, streamed_nk = (_streamed(m, k, n, nk, warm, cache) for nk in (False, True))
        cells = " ".join(
            f"{t * 1e6:8.0f} ({flops(shape) / t / 1e9:5.1f})" for t in (engine, warm, streamed, streamed_nk)
        )
        lines.append(f"{m:>6} x {k:>4} x {n:>5} {e.count:>6} {cells}")
    return "\n".join(lines)


def _streamed(m: int, k: int, n: int, nk: bool, warm: float, cache: int) -> float:
    stream = WeightStream(k, n, torch.float32, cache, nk=nk)
    return stream.time(m, streamed_calls(warm, len(stream.weights)))[0]


if __name__ == "__main__":
    main()
