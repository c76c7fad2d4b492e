"""`conveyor worker --nice N`: every thread of the worker, those it starts later, and its child processes
run at the raised niceness. Each case runs in a process of its own: a raised niceness cannot be undone."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import spawn_worker
from worker.cli.main import main
from worker.cli.niceness import lower_priority
from worker.client import collect, enqueue

ROOT = Path(__file__).resolve().parents[3]
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="per-thread niceness is Linux's")

PROBE = """
import json, os, subprocess, sys, threading
from worker.cli.niceness import lower_priority

def nice(tid=0):
    return os.getpriority(os.PRIO_PROCESS, tid)

stop = threading.Event()
before = threading.Thread(target=stop.wait)
before.start()
base = nice()
now = lower_priority(int(sys.argv[1]), whole_process=sys.argv[2] == "all")
later = []
after = threading.Thread(target=lambda: later.append(nice()))
after.start(); after.join()
child = subprocess.run([sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
                       capture_output=True, text=True, check=True).stdout
seen = {"base": base, "now": now, "caller": nice(), "before": nice(before.native_id), "after": later[0],
        "child": int(child)}
stop.set(); before.join()
print(json.dumps(seen))
"""


def probe(increment: int, which: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(increment), which], cwd=ROOT, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


@linux_only
def test_every_thread_and_what_it_starts_later_is_lowered():
    seen = probe(5, "all")
    want = min(seen["base"] + 5, 19)
    assert seen["now"] == want
    assert [seen[k] for k in ("caller", "before", "after", "child")] == [want] * 4


@linux_only
def test_only_the_calling_thread_when_asked():
    """What the benchmark uses: the engine's thread, not the one that starts the measuring processes."""
    seen = probe(7, "this")
    want = min(seen["base"] + 7, 19)
    assert (seen["caller"], seen["after"], seen["child"]) == (want, want, want)
    assert seen["before"] == seen["base"]


@pytest.mark.parametrize("increment", [-1, 20])
def test_an_increment_out_of_range_is_refused(increment):
    with pytest.raises(ValueError, match="0 to 19"):
        lower_priority(increment)
    result = CliRunner().invoke(main, ["worker", "--model", "/m", "--nice", str(increment)])
    assert result.exit_code == 2 and "--nice" in result.output


def _thread_niceness(pid: int) -> list[int]:
    """Field 19 of /proc/PID/task/TID/stat, after the command name (which may hold spaces)."""
    values = []
    for stat in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            values.append(int(stat.read_text().rpartition(")")[2].split()[16]))
        except FileNotFoundError:  # a thread that ended meanwhile
            pass
    return values


@linux_only
@pytest.mark.redis
@pytest.mark.timeout(120)
def test_a_worker_started_with_nice_computes_at_that_niceness(redis_server, r, tiny_model, tmp_path):
    assert os.getpriority(os.PRIO_PROCESS, 0) < 19, "the test needs room to raise the niceness"
    proc = spawn_worker(redis_server.url, tiny_model, "niced", tmp_path / "w.log", "--nice", "19")
    try:
        enqueue(r, {"id": "n1", "prompt": "a niced worker", "max_tokens": 8, "temperature": 0})
        events = collect(r, "n1", timeout_s=90)
        assert events[-1]["type"] == "done"
        wait_until(lambda: len(_thread_niceness(proc.pid)) > 1, 10, "the worker's threads")
        # torch's pool, the I/O thread and the metrics server are all made after the option was applied
        assert set(_thread_niceness(proc.pid)) == {19}, "every thread of the worker"
    finally:
        proc.terminate()
        proc.wait(timeout=60)
