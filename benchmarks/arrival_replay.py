"""Requests arriving as a Poisson process, served by one engine on a simulated clock.

The clock advances by each `engine.step()`'s measured wall time, and jumps over idle gaps to the next
arrival instead of sleeping: a run at a low rate costs only its compute, and the latencies are what a
client would see if steps took what they took here. Before each step the arrivals up to the clock join
(a busy worker reads new jobs every step); an idle engine waits for the next arrival and then, like the
worker's `--max-wait-ms` (worker/intake/stream_reader.py), gathers arrivals for up to `max_wait_s` or
until `max_num_seqs` have come, before its first step.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import dataclass

import numpy as np

from benchmarks.workload import Job
from engine import SamplingParams


def poisson_times(n: int, rate: float, seed: int = 0) -> list[float]:
    """Arrival times (s) of n requests at `rate` per second; math.inf: all at time 0 (a saturating burst)."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


@dataclass
class _Tally:
    """Per-step counters of one replay."""

    steps: int = 0
    step_seconds: float = 0.0
    unwritten: int = 0  # KV slots held but not written, summed over steps
    held: int = 0  # KV slots held, summed over steps
    peak: tuple[int, int] = (0, 0)  # (unwritten, held) at the step holding the most
    most_seqs: int = 0  # most requests computing in one step

    def add_step(self, engine, seconds: float) -> None:
        self.steps += 1
        self.step_seconds += seconds
        unwritten, held = engine.kv_waste()
        self.unwritten += unwritten
        self.held += held
        if held > self.peak[1]:
            self.peak = (unwritten, held)
        self.most_seqs = max(self.most_seqs, len(engine.step_tokens()))


def replay(engine, jobs: list[Job], times: list[float], max_wait_s: float = 0.0) -> dict:
    """Serve `jobs` arriving at `times` (sorted); returns throughput, latency percentiles and KV use."""
    room = engine.config.max_num_seqs
    arrival: dict[str, float] = {}
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    produced: dict[str, int] = {}
    tally = _Tally()
    clock, i = 0.0, 0
    preempted_before = engine.stats().num_preemptions

    def admit(until: float, most: int = len(jobs)) -> int:
        nonlocal i
        added = 0
        while i < len(jobs) and times[i] <= until and added < most:
            rid = f"r{i}"
            job = jobs[i]
            params = SamplingParams(max_tokens=job.max_tokens, temperature=0, ignore_eos=job.ignore_eos)
            engine.add_request(rid, job.prompt_token_ids, params)
            arrival[rid] = times[i]
            i += 1
            added += 1
        return added

    while i < len(jobs) or engine.has_unfinished_requests():
        if engine.has_unfinished_requests():
            admit(clock)
        else:  # idle: the next arrival wakes the engine, then it gathers up to max_wait_s
            clock = max(clock, times[i])
            gathered = admit(clock, room)
            if max_wait_s > 0:
                deadline = clock + max_wait_s
                while gathered < room and i < len(jobs) and times[i] <= deadline:
                    clock = times[i]
                    gathered += admit(clock, room - gathered)
                if gathered < room:
                    clock = deadline
        t0 = time.perf_counter()
        deltas = engine.step()
        dt = time.perf_counter() - t0
        clock += dt
        tally.add_step(engine, dt)
        for d in deltas:
            if d.new_token_ids:
                first.setdefault(d.request_id, clock)
                produced[d.request_id] = produced.get(d.request_id, 0) + len(d.new_token_ids)
            if d.finished:
                done[d.request_id] = clock
    summary = _summary(arrival, first, done, produced, tally)
    summary["preemptions"] = engine.stats().num_preemptions - preempted_before
    return summary


def _summary(arrival, first, done, produced, tally: _Tally) -> dict:
    ids = sorted(arrival)
    ttft = [first[r] - arrival[r] for r in ids]
    e2e = [done[r] - arrival[r] for r in ids]
    itl = [(done[r] - first[r]) / (produced[r] - 1) for r in ids if produced[r] > 1]
    span = max(done.values()) - min(arrival.values())
    tokens = sum(produced.values())
    return {
        "requests": len(ids),
        "output_tokens": tokens,
        "output_lengths": [produced[r] for r in ids],
        "seconds": span,
        "tokens_per_s": tokens / span,
        "ttft_p50_s": _pct(ttft, 50),
        "ttft_p99_s": _pct(ttft, 99),
        "e2e_p50_s": _pct(e2e, 50),
        "e2e_p99_s": _pct(e2e, 99),
        "itl_p50_s": _pct(itl, 50),
        "itl_p99_s": _pct(itl, 99),
        "steps": tally.steps,
        "step_seconds": tally.step_seconds,
        "mean_step_s": tally.step_seconds / max(1, tally.steps),
        # KV slots held but not written, over slots held: summed over every step, and at the fullest step.
        "kv_waste_mean": tally.unwritten / max(1, tally.held),
        "kv_waste_at_peak": tally.peak[0] / max(1, tally.peak[1]),
        "kv_slots_at_peak": tally.peak[1],
        "most_concurrent_seqs": tally.most_seqs,
    }


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else 0.0
