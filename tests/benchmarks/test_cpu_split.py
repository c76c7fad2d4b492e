"""benchmarks/cpu_split.py: the measuring processes on the last CPU, the measured ones on the others."""

from __future__ import annotations

import multiprocessing as mp
import os
import subprocess
import sys

import pytest

from benchmarks import cpu_split
from benchmarks.cpu_split import CpuSplit, pin, run_pinned, split_cpus

needs_two = pytest.mark.skipif(
    not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2, reason="needs 2 CPUs"
)


def test_the_last_usable_cpu_measures_and_the_rest_are_served(monkeypatch):
    monkeypatch.setattr(cpu_split.os, "sched_getaffinity", lambda pid: {5, 2, 7, 3})
    assert split_cpus() == CpuSplit(served=frozenset({2, 3, 5}), measurers=frozenset({7}))
    assert split_cpus().as_json() == {"served": [2, 3, 5], "measurers": [7]}


def test_one_cpu_pins_nothing(monkeypatch):
    monkeypatch.setattr(cpu_split.os, "sched_getaffinity", lambda pid: {3})
    assert split_cpus() is None


def _report_cpus(queue) -> None:
    queue.put(sorted(os.sched_getaffinity(0)))


@needs_two
def test_a_spawned_target_runs_on_the_cpus_it_is_given():
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    last = max(os.sched_getaffinity(0))
    proc = ctx.Process(target=run_pinned, args=(frozenset({last}), _report_cpus, queue))
    proc.start()
    try:
        assert queue.get(timeout=60) == [last]
    finally:
        proc.join(timeout=30)
    proc = ctx.Process(target=run_pinned, args=(None, _report_cpus, queue))  # None: anywhere
    proc.start()
    try:
        assert queue.get(timeout=60) == sorted(os.sched_getaffinity(0))
    finally:
        proc.join(timeout=30)


CHILD = """
import os, sys, threading
stop = threading.Event()
early = threading.Thread(target=stop.wait)
early.start()
print(early.native_id, flush=True)
sys.stdin.readline()  # pinned meanwhile
late = []
t = threading.Thread(target=lambda: late.append(sorted(os.sched_getaffinity(0))))
t.start(); t.join()
print(sorted(os.sched_getaffinity(early.native_id)), late[0], sorted(os.sched_getaffinity(0)), flush=True)
stop.set(); early.join()
"""


@needs_two
def test_pin_moves_every_thread_a_process_has_and_the_ones_it_starts_later():
    first = min(os.sched_getaffinity(0))
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        proc.stdout.readline()  # the early thread exists
        pin(proc.pid, frozenset({first}))
        out, _ = proc.communicate("go\n", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    # the thread that existed before, the one started after, the main thread
    assert out.strip() == f"[{first}] [{first}] [{first}]"
