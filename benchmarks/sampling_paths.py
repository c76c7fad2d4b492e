"""Time `engine.sampling.race` on [256, 32000] logits for each way rows find their candidates.

    python benchmarks/sampling_paths.py                 # prints ms per call and writes JSON
    python benchmarks/sampling_paths.py --profile       # + where the full-sampling call spends its time
    PYTHONPATH=<other checkout> python <this file> ...   # the same on other code, for a side-by-side

Configurations: top_k 50 (with top_p 0.95), the same with repetition_penalty 1.1 over 1k-token contexts
(the host-overhead benchmark's sampling scenario) applied two ways, interleaved call by call: on the top-k
candidates (`SeenPenalty`, what the sampler does for such rows) and as sparse edits of every seen token
(gather, scale, scatter, restore: what it did before, and still does for rows without a top-k); top_p 0.95
alone, temperature alone. Logits: N(0, 3^2) over the whole vocabulary. One torch thread; the
median of --repeats calls after one warm-up call. `--profile` runs cProfile over the penalised call and
prints the operations that take the most time (numpy and torch calls appear as built-in methods).
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from engine.sampling.race import race

CONFIGS = {
    "top_k_50_top_p_0.95": dict(top_k=50, top_p=0.95),
    "top_k_50_top_p_0.95_rep_1.1": dict(top_k=50, top_p=0.95, repetition_penalty=1.1),
    "top_p_0.95": dict(top_k=32000, top_p=0.95),
    "temperature_only": dict(top_k=32000, top_p=1.0),
}


def repetition_penalty(rows: int, vocab: int, factor: float):
    """The sampler's penalty state for `rows` requests with ~1k-token contexts: (the `SeenPenalty` of
    their top-k candidates, the same penalty as sparse edits: a callable (logits, race call) -> tokens).
    None if the code predates it."""
    try:
        from engine.sampling.host_sampler import Sampler, _SparseEdits
    except ImportError:
        return None
    from engine.core.request import Request
    from engine.sampling_params import SamplingParams

    gen = torch.Generator().manual_seed(1)
    params = SamplingParams(temperature=0.8, top_k=50, top_p=0.95, repetition_penalty=factor, seed=1)
    reqs = [
        Request(f"r{i}", torch.randint(0, vocab, (1000,), generator=gen).tolist(), params, 0.0)
        for i in range(rows)
    ]
    sampler = Sampler(vocab, frozenset())
    view = sampler.requests.sync(reqs)
    penalty, _, _ = sampler.repetition(view)
    row, col = view.seen_index(np.arange(rows))
    rows_t, cols_t = torch.from_numpy(row), torch.from_numpy(col)
    rep = torch.from_numpy(view.repetition)[rows_t]

    def by_edits(logits: torch.Tensor, *call) -> list[int]:
        edits = _SparseEdits(logits)
        x = edits.get(rows_t, cols_t)
        edits.put(rows_t, cols_t, torch.where(x > 0, x / rep, x * rep), old=x)
        try:
            return race(logits, *call)
        finally:
            edits.restore()

    return penalty, by_edits


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(1)
    rows = args.rows
    logits = torch.randn(rows, 32000, generator=torch.Generator().manual_seed(0)) * 3
    seeds = np.arange(1, rows + 1, dtype=np.uint64)
    out = {}
    for name, cfg in CONFIGS.items():
        call = (logits, [0.8] * rows, [cfg["top_k"]] * rows, [cfg["top_p"]] * rows, [0.0] * rows, seeds)
        ways = {name: lambda call=call: race(*call)}
        if "repetition_penalty" in cfg:
            state = repetition_penalty(rows, 32000, cfg["repetition_penalty"])
            if state is None:
                print(f"{name:40s} (no penalty on candidates in this code)")
                continue
            penalty, by_edits = state
            ways = {
                f"{name} candidates": lambda call=call, penalty=penalty: race(*call, penalty),
                f"{name} sparse edits": lambda call=call, by_edits=by_edits: by_edits(*call),
            }
            assert race(*call, penalty) == by_edits(*call)  # the same tokens either way
        for way in ways.values():
            way()  # warm-up
        times: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(args.repeats):  # interleaved: load on the machine hits every way alike
            for w, way in ways.items():
                t0 = time.perf_counter()
                way()
                times[w].append(time.perf_counter() - t0)
        for w in ways:
            out[w] = statistics.median(times[w]) * 1e3
            print(f"{w:40s} {out[w]:9.1f} ms", flush=True)
        if args.profile and "repetition_penalty" in cfg:
            prof = cProfile.Profile()
            for _ in range(args.repeats):
                prof.runcall(race, *call, penalty)
            stats = pstats.Stats(prof)
            top = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:14]  # by own time
            for (file, line, func), (_, calls, own, _, _) in top:
                where = func if file == "~" else f"{Path(file).name}:{line}({func})"
                print(f"    {own / args.repeats * 1e3:7.2f} ms  x{calls // args.repeats:<3d} {where}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "ms": out}, indent=2) + "\n")


if __name__ == "__main__":
    main()
