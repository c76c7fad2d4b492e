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
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import torch

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


def time_gemm(shape: Shape, dtype: torch.dtype, repeats: int = 3) -> tuple[float, float]:
    """(wall, process CPU) seconds of one torch.matmul at this shape: each the minimum over repeats,
    after one untimed call."""
    m, k, n = shape
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    out = torch.empty(m, n, dtype=dtype)
    torch.matmul(a, b, out=out)
    wall = cpu = float("inf")
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        torch.matmul(a, b, out=out)
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu


def gemm_baseline(counts: Counter[Shape], dtype: torch.dtype) -> tuple[float, float]:
    """(wall, CPU) seconds the run's linear products take as lone matmuls."""
    wall = cpu = 0.0
    for shape, n in counts.items():
        w, c = time_gemm(shape, dtype)
        wall, cpu = wall + n * w, cpu + n * c
    return wall, cpu


def mfu_report(rec: StepRecorder, dtype: torch.dtype) -> dict:
    """The run's FLOPs and the GEMM rate of its shapes; `utilisation(report, seconds)` turns it into MFU."""
    args = rec.model_args
    counts = shape_counts(rec, args)
    linear = sum(n * flops(s) for s, n in counts.items())
    attention = 4 * rec.attended_keys * args.num_heads * args.head_dim * args.num_layers
    gemm_seconds, gemm_cpu_seconds = gemm_baseline(counts, dtype)
    return {
        "steps": len(rec.rows),
        "linear_gflop": linear / 1e9,
        "attention_gflop": attention / 1e9,
        "gemm_shapes_timed": len(counts),
        "gemm_seconds_at_run_shapes": gemm_seconds,
        "gemm_rate_gflops": linear / gemm_seconds / 1e9,
        # The same in process CPU time: on a busy machine wall time counts the turns other processes
        # take; compare with a run's `cpu_seconds` (utilisation(..., cpu_seconds=...)).
        "gemm_rate_gflops_cpu_time": linear / gemm_cpu_seconds / 1e9,
    }


def utilisation(report: dict, seconds: float, cpu_seconds: float | None = None) -> dict:
    """Achieved GFLOP/s of a run that did the recorded work in `seconds`, and its share of the GEMM rate;
    with `cpu_seconds`, also the share in CPU time (`mfu_cpu_time`)."""
    work = report["linear_gflop"] + report["attention_gflop"]
    out = {"achieved_gflops": work / seconds, "mfu": work / seconds / report["gemm_rate_gflops"]}
    if cpu_seconds is not None:
        out["mfu_cpu_time"] = work / cpu_seconds / report["gemm_rate_gflops_cpu_time"]
    return out
