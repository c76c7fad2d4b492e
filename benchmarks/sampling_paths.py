"""Time `engine.sampling.race` on [256, 32000] logits for each way rows find their candidates.

    python benchmarks/sampling_paths.py                 # prints ms per call and writes JSON
    PYTHONPATH=<other checkout> python <this file> ...   # the same on other code, for a side-by-side

Configurations: top_k 50 (with top_p 0.95), top_p 0.95 alone, temperature alone. Logits: N(0, 3^2) over
the whole vocabulary. One torch thread; the median of --repeats calls after one warm-up call.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from engine.sampling.race import race

CONFIGS = {
    "top_k_50_top_p_0.95": dict(top_k=50, top_p=0.95),
    "top_p_0.95": dict(top_k=32000, top_p=0.95),
    "temperature_only": dict(top_k=32000, top_p=1.0),
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = args.rows
    logits = torch.randn(rows, 32000, generator=torch.Generator().manual_seed(0)) * 3
    seeds = np.arange(1, rows + 1, dtype=np.uint64)
    out = {}
    for name, cfg in CONFIGS.items():
        call = (logits, [0.8] * rows, [cfg["top_k"]] * rows, [cfg["top_p"]] * rows, [0.0] * rows, seeds)
        race(*call)
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            race(*call)
            times.append(time.perf_counter() - t0)
        out[name] = statistics.median(times) * 1e3
        print(f"{name:22s} {out[name]:9.1f} ms", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "ms": out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
