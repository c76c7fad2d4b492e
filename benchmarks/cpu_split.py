"""Where a benchmark's measuring processes run: apart from the process they measure.

benchmarks/http_e2e.py's HTTP client and Redis reader stand for clients on other machines. On a small
host they share the gateway's cores, and each chunk the gateway writes wakes the client, which the kernel
places on the writer's core (a socket's wake-up says the writer is about to sleep). In a quarter of the
gateway's passes over ~60 streams it was switched out about once per stream it wrote, and such a pass
took 1.5-2x its CPU time. So the measurers get the last CPU of those
the benchmark may use and the gateway the others; the engine and Redis keep every CPU. With fewer than
two CPUs, or where affinity cannot be set, nothing is pinned. On two cores this costs a CPU engine
throughput where the gateway takes a large share of its one core (benchmarks/RESULTS.md, the gateway's
section).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class CpuSplit:
    served: frozenset[int]  # the measured processes (the gateway's replicas)
    measurers: frozenset[int]  # the client and the reader

    def as_json(self) -> dict[str, list[int]]:
        return {"served": sorted(self.served), "measurers": sorted(self.measurers)}


def split_cpus() -> CpuSplit | None:
    """The last usable CPU for the measurers, the rest for the served; None with fewer than two."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    return CpuSplit(served=frozenset(cpus[:-1]), measurers=frozenset(cpus[-1:]))


def pin(pid: int, cpus: frozenset[int]) -> None:
    """Every thread `pid` has now to `cpus`; threads it starts later inherit their creator's CPUs.
    (sched_setaffinity on a process id sets only its main thread's.)"""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except ProcessLookupError:  # a thread that ended meanwhile
            pass


def run_pinned(cpus: frozenset[int] | None, target: Callable[..., Any], *args: Any) -> None:
    """A process's target, run on `cpus` (None: anywhere): the process pins itself before it starts any
    thread. Module-level, so that a spawned process can be given it."""
    if cpus is not None:
        os.sched_setaffinity(0, cpus)
    target(*args)
