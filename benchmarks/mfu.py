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
The GEMM baseline times each distinct linear shape alone and weights it by how often the run issued that
shape; attention is not in the baseline (its shapes change every step), so MFU counts attention FLOPs as
work but measures the rate against the linear layers'.

Three baselines (benchmarks/gemm_baseline.py): `warm` (one [K, N] weight kept in cache), `streamed` (the
weight read from DRAM on every call, as in the engine) and `streamed_nk` (the same in nn.Linear's [N, K]
layout, as the engine holds its weights). MFU against streamed_nk is the honest one for the engine as it
is; against streamed, the room a [K, N] weight layout would leave; against warm, the ceiling a perfectly
cache-blocked schedule could approach.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch

from benchmarks.gemm_baseline import Shape, gemm_baseline, last_level_cache_bytes, streamed_copies


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

        def recording_execute(sched_out, requests, forward=None):
            rec.record(sched_out)
            return execute(sched_out, requests, forward)

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
        # The streamed baselines: every call's weight read from DRAM (benchmarks/gemm_baseline.py).
        "streamed_cache_bytes": cache_bytes,
        "streamed_weights_per_shape": {
            f"{k}x{n}": streamed_copies(k * n * dtype.itemsize, cache_bytes)
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
