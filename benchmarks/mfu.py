"""Model FLOP utilisation: the matmul FLOPs a run computed, over its time, against the GEMM rate that the
same [M, K] x [K, N] shapes reach alone on this machine, measured in the same process.

    recorder = StepRecorder.attach(engine)      # before the run: logs what every step computes
    ... run ...
    report = mfu_report(recorder, dtype)          # FLOPs, GEMM rate at the run's shapes
    utilisation(report, seconds)                  # achieved GFLOP/s and MFU of a run that took `seconds`

Counted per step, from the scheduler's output (so preemption recomputes and prefix-cache hits count as
what was actually computed):
  linear layers  T rows (prefill tokens + decode rows) through qkv, o, gate_up and down in every layer,
                 B rows (one per sampled sequence) through the LM head;
  attention      QK^T and PV over the causal context of every query row: query i of a chunk that starts
                 at position p sees p + i + 1 keys.
The GEMM baseline times torch.matmul once per distinct linear shape (the minimum of a few repeats) and
weights it by how often the run issued that shape; attention is not in the baseline (its shapes change
every step), so MFU counts attention FLOPs as work but measures the rate against the linear layers'.

Three baselines, all reported:
  warm         every repeat multiplies by the same [K, N] weight, which after the first call sits in the
               CPU's caches (a few MB: all of it fits the last-level cache): the rate a GEMM reaches from
               cache. The figure reported before the other two were added.
  streamed     every call multiplies by the next of enough distinct [K, N] weights of that shape to fill
               the last-level cache STREAM_FACTOR times over, so each one comes from DRAM, as in the
               engine, which reads every layer's weights once per step (220 MB for the 55M-parameter
               fp32 model). warm -> streamed is what reading the weights from DRAM costs.
  streamed_nk  the same, with the weights as the engine holds them: nn.Linear's [N, K], through F.linear
               (a product with the transposed weight). streamed -> streamed_nk is what that layout costs.
MFU against streamed_nk is the honest one for the engine as it is (same bytes from DRAM, same layout);
against streamed, the room a [K, N] weight layout would leave; against warm, the ceiling a perfectly
cache-blocked schedule could approach.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

Shape = tuple[int, int, int]  # (M, K, N) of one [M, K] x [K, N] product


@dataclass
class StepRecorder:
    """Wraps `engine.runner.execute` to log, per step, the rows through the linear layers and the LM head
    and the causal key count of attention."""

    model_args: object  # engine.models.ModelArgs of the model the engine runs
    rows: list[int] = field(default_factory=list)  # T per step
    sampled: list[int] = field(default_factory=list)  # B per step
    attended_keys: int = 0  # sum over query rows of the keys each sees (one layer, one head)

    @classmethod
    def attach(cls, engine) -> StepRecorder:
        rec = cls(model_args=engine.runner.model.args)
        execute = engine.runner.execute

        def recording_execute(sched_out, requests):
            rec.record(sched_out)
            return execute(sched_out, requests)

        engine.runner.execute = recording_execute
        return rec

    def record(self, sched_out) -> None:
        t = b = 0
        for s in sched_out.sequences:
            q, p = len(s.token_ids), s.start_pos
            t += q
            b += s.sample  # one LM head row per sampled sequence, forks included
            self.attended_keys += q * p + q * (q + 1) // 2
        if t:
            self.rows.append(t)
            self.sampled.append(b)


def linear_shapes(args, rows: int) -> list[Shape]:
    """The products one forward issues per layer for `rows` tokens (fused q/k/v and gate/up)."""
    h, i = args.hidden_size, args.intermediate_size
    qkv = (args.num_heads + 2 * args.num_kv_heads) * args.head_dim
    return [(rows, h, qkv), (rows, args.num_heads * args.head_dim, h), (rows, h, 2 * i), (rows, i, h)]


def shape_counts(rec: StepRecorder, args) -> Counter[Shape]:
    counts: Counter[Shape] = Counter()
    for t, b in zip(rec.rows, rec.sampled, strict=True):
        for shape in linear_shapes(args, t):
            counts[shape] += args.num_layers
        if b:
            counts[(b, args.hidden_size, args.vocab_size)] += 1
    return counts


def flops(shape: Shape) -> int:
    m, k, n = shape
    return 2 * m * k * n


STREAM_FACTOR = 4  # the streamed baseline's weights of one shape fill the last-level cache 4x over
DEFAULT_CACHE_BYTES = 32 << 20  # when sysfs does not say (the EPYC this was tuned on has a 32 MiB L3)


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
    """Distinct weights to cycle through so one pass reads `factor` x the cache: at least 2, so that no
    call finds its weight from the call before."""
    return max(2, -(-factor * cache_bytes // weight_bytes))


def _timed(fn, repeats: int, enough_s: float = float("inf")) -> tuple[float, float]:
    """(wall, process CPU) seconds of fn(), each the minimum over repeats; stops repeating once a call
    took `enough_s` (long calls vary little, and the streamed passes of prefill shapes take seconds)."""
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
        if wall >= enough_s:
            break
    return wall, cpu


def time_gemm(shape: Shape, dtype: torch.dtype, repeats: int = 3) -> tuple[float, float]:
    """(wall, process CPU) seconds of one torch.matmul at this shape: each the minimum over repeats,
    after one untimed call. The weight stays in cache between repeats (the warm baseline)."""
    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    out = torch.empty(m, n, dtype=dtype)
    torch.matmul(a, b, out=out)
    return _timed(lambda: torch.matmul(a, b, out=out), repeats)


def time_gemm_streamed(
    m: int, weights: list[torch.Tensor], nk: bool = False, repeats: int = 2
) -> tuple[float, float]:
    """(wall, process CPU) seconds of one product of an [m, K] input by one of `weights`, when every call
    uses the next weight: a pass over all of them, divided by their number; the minimum over repeats (one
    pass if it took 0.5 s). Weights [K, N] through torch.matmul, or with `nk` [N, K] through F.linear as
    the engine's layers do. Call after time_gemm of the same shape (its untimed call pays one-off kernel
    set-up)."""
    k = weights[0].shape[1] if nk else weights[0].shape[0]
    n = weights[0].shape[0] if nk else weights[0].shape[1]
    a = torch.randn(m, k, dtype=weights[0].dtype)
    out = torch.empty(m, n, dtype=a.dtype)

    def one_pass() -> None:
        for w in weights:
            if nk:
                F.linear(a, w)
            else:
                torch.matmul(a, w, out=out)

    wall, cpu = _timed(one_pass, repeats, enough_s=0.5)
    return wall / len(weights), cpu / len(weights)


def weight_set(k: int, n: int, dtype: torch.dtype, cache_bytes: int, nk: bool = False) -> list[torch.Tensor]:
    """Distinct [K, N] weights ([N, K] with `nk`), copies of one random tensor (same values, separate
    memory), enough to fill the cache STREAM_FACTOR times."""
    w = torch.randn(*((n, k) if nk else (k, n)), dtype=dtype)
    return [w] + [w.clone() for _ in range(streamed_copies(w.nbytes, cache_bytes) - 1)]


def gemm_baseline(counts: Counter[Shape], dtype: torch.dtype, cache_bytes: int | None = None) -> GemmSeconds:
    """Seconds the run's linear products take as lone matmuls, per baseline. Shapes are taken by weight
    shape (K, N) so each weight set is built once and freed before the next."""
    cache_bytes = cache_bytes or last_level_cache_bytes()
    total = [0.0] * 6
    for kn in sorted({(k, n) for _, k, n in counts}):
        shapes = sorted(s for s in counts if s[1:] == kn)
        weights = weight_set(*kn, dtype, cache_bytes)
        for shape in shapes:
            times = time_gemm(shape, dtype) + time_gemm_streamed(shape[0], weights)
            for i, t in enumerate(times):
                total[i] += counts[shape] * t
        del weights  # before the next set is built: at most one set (4x the cache) alive
        weights = weight_set(*kn, dtype, cache_bytes, nk=True)
        for shape in shapes:
            wall, cpu = time_gemm_streamed(shape[0], weights, nk=True)
            total[4], total[5] = total[4] + counts[shape] * wall, total[5] + counts[shape] * cpu
        del weights
    return GemmSeconds(*total)


def mfu_report(rec: StepRecorder, dtype: torch.dtype, cache_bytes: int | None = None) -> dict:
    """The run's FLOPs and the GEMM rates of its shapes; `utilisation(report, seconds)` turns it into MFU."""
    args = rec.model_args
    counts = shape_counts(rec, args)
    linear = sum(n * flops(s) for s, n in counts.items())
    attention = 4 * rec.attended_keys * args.num_heads * args.head_dim * args.num_layers
    cache_bytes = cache_bytes or last_level_cache_bytes()
    t = gemm_baseline(counts, dtype, cache_bytes)
    return {
        "steps": len(rec.rows),
        "linear_gflop": linear / 1e9,
        "attention_gflop": attention / 1e9,
        "gemm_shapes_timed": len(counts),
        "gemm_seconds_at_run_shapes": t.warm,
        "gemm_rate_gflops": linear / t.warm / 1e9,
        # The same in process CPU time: on a busy machine wall time counts the turns other processes
        # take; compare with a run's `cpu_seconds` (utilisation(..., cpu_seconds=...)).
        "gemm_rate_gflops_cpu_time": linear / t.warm_cpu / 1e9,
        # The streamed baseline: every call's weight read from DRAM (see the module docstring).
        "streamed_cache_bytes": cache_bytes,
        "streamed_weights_per_shape": {
            f"{k}x{n}": streamed_copies(k * n * _itemsize(dtype), cache_bytes)
            for k, n in sorted({(k, n) for _, k, n in counts})
        },
        "gemm_seconds_at_run_shapes_streamed": t.streamed,
        "gemm_rate_gflops_streamed": linear / t.streamed / 1e9,
        "gemm_rate_gflops_streamed_cpu_time": linear / t.streamed_cpu / 1e9,
        # The same with the engine's weight layout ([N, K] through F.linear).
        "gemm_seconds_at_run_shapes_streamed_nk": t.streamed_nk,
        "gemm_rate_gflops_streamed_nk": linear / t.streamed_nk / 1e9,
        "gemm_rate_gflops_streamed_nk_cpu_time": linear / t.streamed_nk_cpu / 1e9,
    }


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


BASELINES = ("", "_streamed", "_streamed_nk")  # suffixes of the report's GEMM rates and of the MFU keys


def utilisation(report: dict, seconds: float, cpu_seconds: float | None = None) -> dict:
    """Achieved GFLOP/s of a run that did the recorded work in `seconds`, and its share of each GEMM rate
    the report has (`mfu` warm, `mfu_streamed`, `mfu_streamed_nk`); with `cpu_seconds`, also the shares
    in CPU time (`mfu_cpu_time`, ...)."""
    work = report["linear_gflop"] + report["attention_gflop"]
    out = {"achieved_gflops": work / seconds}
    for b in BASELINES:
        if f"gemm_rate_gflops{b}" in report:
            out[f"mfu{b}"] = work / seconds / report[f"gemm_rate_gflops{b}"]
    if cpu_seconds is not None:
        for b in BASELINES:
            if f"gemm_rate_gflops{b}_cpu_time" in report:
                out[f"mfu{b}_cpu_time"] = work / cpu_seconds / report[f"gemm_rate_gflops{b}_cpu_time"]
    return out
