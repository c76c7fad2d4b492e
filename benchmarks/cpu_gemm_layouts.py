"""Ways to compute the benchmark model's linear layers on the CPU, timed side by side at the row counts
the engine issues (decode batches of 32/64 rows, prefill chunks).

    python benchmarks/cpu_gemm_layouts.py [--rows 32,64,512] [--threads N] [--repeats 15]

Variants, all computing x [M, K] times a weight stored as nn.Linear keeps it, [N, K]:
  linear      F.linear(x, w): what nn.Linear does
  linear_out  torch.mm(x, w.t(), out=buf) into a preallocated output
  kn          x @ w_kn, the weight stored transposed once at load, [K, N] contiguous
  sliced_S    the N output columns computed S weight rows at a time, each written into its columns of a
              preallocated [M, N] output (an exact split: no reduction is cut)
The runs of every variant are interleaved so that a busy machine slows them alike; the minimum and median
of the repeats are printed, with GFLOP/s at the minimum (wall time, or CPU time with --clock cpu). Writes benchmarks/results/cpu_gemm_layouts.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import BENCH_MODEL  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def bench_shapes() -> dict[str, tuple[int, int]]:
    """name -> (K, N) of every product in the benchmark model (fused qkv and gate/up)."""
    h, i, v = BENCH_MODEL["hidden_size"], BENCH_MODEL["intermediate_size"], BENCH_MODEL["vocab_size"]
    return {"qkv": (h, 3 * h), "o": (h, h), "gate_up": (h, 2 * i), "down": (i, h), "lm_head": (h, v)}


def variants(x: torch.Tensor, w: torch.Tensor, slices: list[int]) -> dict:
    m, n = x.shape[0], w.shape[0]
    out = torch.empty(m, n, dtype=x.dtype)
    w_kn = w.t().contiguous()

    def sliced(size: int):
        def run() -> torch.Tensor:
            for s in range(0, n, size):
                torch.mm(x, w[s : s + size].t(), out=out[:, s : s + size])
            return out

        return run

    found = {
        "linear": lambda: F.linear(x, w),
        "linear_out": lambda: torch.mm(x, w.t(), out=out),
        "kn": lambda: x @ w_kn,
    }
    for size in slices:
        if size < n:
            found[f"sliced_{size}"] = sliced(size)
    return found


def time_interleaved(fns: dict, repeats: int, clock=time.perf_counter) -> dict[str, list[float]]:
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = clock()
            fn()
            times[name].append(clock() - t0)
    return times


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", default="32,64,512")
    p.add_argument("--shapes", default=",".join(bench_shapes()))
    p.add_argument("--slices", default="512,1024,2048,4096,8192")
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument(
        "--clock",
        choices=["wall", "cpu"],
        default="wall",
        help="cpu: this process's CPU time, steadier than wall time on a busy machine (use with --threads 1)",
    )
    p.add_argument("--out", type=Path, default=RESULTS / "cpu_gemm_layouts.json")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    slices = [int(s) for s in a.slices.split(",")]
    shapes = bench_shapes()
    report = {"threads": a.threads, "clock": a.clock, "torch": torch.__version__, "results": []}
    for m in (int(r) for r in a.rows.split(",")):
        for name in a.shapes.split(","):
            k, n = shapes[name]
            x, w = torch.randn(m, k), torch.randn(n, k)
            fns = variants(x, w, slices)
            ref = F.linear(x, w)
            exact = {v: bool(torch.equal(fn(), ref)) for v, fn in fns.items()}
            times = time_interleaved(
                fns, a.repeats, time.process_time if a.clock == "cpu" else time.perf_counter
            )
            flop = 2 * m * k * n
            print(f"[{m}, {k}] x [{k}, {n}] ({name})")
            for v, ts in times.items():
                ts.sort()
                row = {
                    "rows": m,
                    "shape": name,
                    "variant": v,
                    "min_ms": ts[0] * 1e3,
                    "median_ms": ts[len(ts) // 2] * 1e3,
                    "gflops_at_min": flop / ts[0] / 1e9,
                    "bitwise_equal_to_linear": exact[v],
                }
                report["results"].append(row)
                print(
                    f"  {v:13s} min {row['min_ms']:8.3f} ms  median {row['median_ms']:8.3f} ms  "
                    f"{row['gflops_at_min']:6.1f} GFLOP/s  exact={exact[v]}"
                )
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
