"""The GEMM rate the engine's linear shapes reach alone on this machine: the denominator of MFU
(benchmarks/mfu.py). Every [M, K] x [K, N] shape a run issued is timed three ways:

  warm         every repeat multiplies by the same [K, N] weight, which after the first call sits in the
               CPU's caches (a few MB: all of it fits the last-level cache): the rate a GEMM reaches from
               cache. The one baseline reported before the other two were added.
  streamed     every call multiplies by the next of enough distinct [K, N] weights of that shape to fill
               the last-level cache STREAM_FACTOR times over, so each one comes from DRAM, as in the
               engine, which reads every layer's weights once per step (220 MB for the 55M-parameter
               fp32 model). warm -> streamed is what reading the weights from DRAM costs.
  streamed_nk  the same, with the weights as the engine holds them: nn.Linear's [N, K], through F.linear
               (a product with the transposed weight). streamed -> streamed_nk is what that layout costs.

The streamed weights are used in turn across all the shapes sharing them (WeightStream): a weight comes
round again only after every other one was read, so it has been evicted; a shape needs only a few calls
of its own, not a pass over all the weights (prefill shapes take ~80 ms a call).
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

Shape = tuple[int, int, int]  # (M, K, N) of one [M, K] x [K, N] product

STREAM_FACTOR = 4  # the streamed weights of one shape fill the last-level cache 4x over
DEFAULT_CACHE_BYTES = 32 << 20  # when sysfs does not say (the EPYC this was tuned on has a 32 MiB L3)
STREAM_SECONDS = 0.25  # a streamed timing runs about this long: calls = this / one warm call, at least 2


@dataclass(frozen=True)
class GemmSeconds:
    """Seconds the run's linear products take as lone matmuls, wall and process CPU time, per baseline."""

    warm: float
    warm_cpu: float
    streamed: float
    streamed_cpu: float
    streamed_nk: float
    streamed_nk_cpu: float


def last_level_cache_bytes(sysfs: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest CPU cache sysfs lists (e.g. "32768K"), else DEFAULT_CACHE_BYTES."""
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    sizes = []
    for f in sysfs.glob("index*/size"):
        text = f.read_text().strip()
        if text[:-1].isdigit() and text[-1] in units:
            sizes.append(int(text[:-1]) * units[text[-1]])
        elif text.isdigit():
            sizes.append(int(text))
    return max(sizes, default=DEFAULT_CACHE_BYTES)


def streamed_copies(weight_bytes: int, cache_bytes: int, factor: int = STREAM_FACTOR) -> int:
    """Distinct weights to use in turn so that a round reads `factor` x the cache: at least 2, so that no
    call finds its weight from the call before."""
    return max(2, -(-factor * cache_bytes // weight_bytes))


def _timed(fn, repeats: int) -> tuple[float, float]:
    """(wall, process CPU) seconds of fn(), each the minimum over repeats."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


def time_gemm(shape: Shape, dtype: torch.dtype, repeats: int = 3) -> tuple[float, float]:
    """(wall, process CPU) seconds of one torch.matmul at this shape: each the minimum over repeats,
    after one untimed call. The weight stays in cache between repeats (the warm baseline)."""
    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    out = torch.empty(m, n, dtype=dtype)
    torch.matmul(a, b, out=out)
    return _timed(lambda: torch.matmul(a, b, out=out), repeats)


class WeightStream:
    """Distinct weights of one (K, N), copies of one random tensor (same values, separate memory), enough
    to fill the cache STREAM_FACTOR times, used in turn: [K, N] through torch.matmul, or with `nk` [N, K]
    through F.linear as the engine's layers do."""

    def __init__(self, k: int, n: int, dtype: torch.dtype, cache_bytes: int, nk: bool = False) -> None:
        self.k, self.n, self.nk = k, n, nk
        w = torch.randn(*((n, k) if nk else (k, n)), dtype=dtype)
        self.weights = [w] + [w.clone() for _ in range(streamed_copies(w.nbytes, cache_bytes) - 1)]
        self.turn = 0  # index of the weight the next call uses
        # One untimed round: the copies written last are still in cache.
        self.time(1, len(self.weights), repeats=1)

    def time(self, m: int, calls: int, repeats: int = 2) -> tuple[float, float]:
        """(wall, process CPU) seconds of one product of an [m, K] input, over `calls` calls that each
        take the next weight in turn; the minimum over repeats."""
        a = torch.randn(m, self.k, dtype=self.weights[0].dtype)
        out = torch.empty(m, self.n, dtype=a.dtype)

        def run() -> None:
            for _ in range(calls):
                w = self.weights[self.turn]
                self.turn = (self.turn + 1) % len(self.weights)
                if self.nk:
                    F.linear(a, w)
                else:
                    torch.matmul(a, w, out=out)

        wall, cpu = _timed(run, repeats)
        return wall / calls, cpu / calls


def streamed_calls(warm_seconds: float, num_weights: int) -> int:
    """Calls a streamed timing makes: about STREAM_SECONDS' worth at the warm rate, 2 to a full round."""
    return min(num_weights, max(2, int(STREAM_SECONDS / max(warm_seconds, 1e-9))))


def gemm_baseline(counts: Counter[Shape], dtype: torch.dtype, cache_bytes: int | None = None) -> GemmSeconds:
    """Seconds the run's linear products take as lone matmuls, per baseline, each shape weighted by how
    often the run issued it. Shapes are taken by (K, N), so each weight stream is built once and freed
    before the next (at most one alive: STREAM_FACTOR x the cache)."""
    cache_bytes = cache_bytes or last_level_cache_bytes()
    total = [0.0] * 6
    for k, n in sorted({(k, n) for _, k, n in counts}):
        shapes = sorted(s for s in counts if s[1:] == (k, n))
        warm = {s: time_gemm(s, dtype) for s in shapes}
        for slot, nk in ((2, False), (4, True)):
            stream = WeightStream(k, n, dtype, cache_bytes, nk=nk)
            for s in shapes:
                wall, cpu = stream.time(s[0], streamed_calls(warm[s][0], len(stream.weights)))
                total[slot], total[slot + 1] = (
                    total[slot] + counts[s] * wall,
                    total[slot + 1] + counts[s] * cpu,
                )
            del stream
        for s in shapes:
            total[0], total[1] = total[0] + counts[s] * warm[s][0], total[1] + counts[s] * warm[s][1]
    return GemmSeconds(*total)
