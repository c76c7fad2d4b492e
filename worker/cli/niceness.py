"""A worker's CPU priority below its neighbours': `conveyor worker --nice N`.

A worker that computes on the CPU keeps every core busy between steps. The gateway, Redis and the clients
on the same host each wake for a moment per step (the gateway's pass over its streams, Redis's replies),
and at equal priority each waits for a core behind the engine's threads: on a small host that wait is
most of the gateway's p99 added latency. At niceness 19 the kernel runs
them first; the engine loses only the few percent of a core they use. A GPU worker's threads mostly wait
for the device and need none of this.
"""

from __future__ import annotations

import os
import sys

MAX_NICENESS = 19  # nice(1)'s range: 0 (unchanged) to 19 (runs after everything else)


def lower_priority(increment: int, whole_process: bool = True) -> int:
    """Raise the niceness by `increment` for this thread and the threads and processes it starts later,
    and (`whole_process`) for every thread the process already has. Returns the niceness now.

    Linux keeps a niceness per thread (setpriority's PRIO_PROCESS on a thread id names that thread), and a
    new thread or process starts with its creator's: so torch's thread pool, made at the first step, and
    tensor-parallel ranks inherit it. Elsewhere setpriority sets the whole process's. Raising one's own
    niceness needs no privilege; lowering it back does, so this is not undone."""
    if not 0 <= increment <= MAX_NICENESS:
        raise ValueError(f"a niceness increment is 0 to {MAX_NICENESS}, not {increment}")
    if not hasattr(os, "setpriority"):
        raise OSError(f"setting a process's niceness is not supported on {sys.platform}")
    target = min(os.getpriority(os.PRIO_PROCESS, 0) + increment, MAX_NICENESS)
    if increment == 0:
        return target
    if sys.platform != "linux":
        os.setpriority(os.PRIO_PROCESS, 0, target)
        return target
    import threading

    threads = [threading.get_native_id()]
    if whole_process:
        threads += [int(t) for t in os.listdir("/proc/self/task") if int(t) != threads[0]]
    for tid in threads:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(target, os.getpriority(os.PRIO_PROCESS, tid)))
        except ProcessLookupError:  # a thread that ended meanwhile
            pass
    return target
