"""`conveyor worker --tensor-parallel-size 2` against a real redis-server: it serves, and when a rank is
killed mid-job it exits non-zero with the error (so its leases lapse and other workers take over)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.helpers.rel_helpers import Workers, enqueue_many, read_events, terminal, wait_terminal
from tests.helpers.waiting import wait_until


def _rank_pids(worker_pid: int) -> list[int]:
    """The worker's spawned rank processes (not multiprocessing's resource tracker)."""
    children = Path(f"/proc/{worker_pid}/task/{worker_pid}/children").read_text().split()
    return [int(pid) for pid in children if b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()]


def test_a_killed_rank_ends_the_worker_with_an_error(tiny_model, redis_server, r, tmp_path):
    client = r
    workers = Workers(tiny_model, tmp_path)
    try:
        w = workers.spawn(redis_server.url, "tp", "--tensor-parallel-size", "2", "--drain-timeout", "5")
        w.wait_started(timeout_s=120)
        job = {"id": "tp-ok", "prompt": "hello there", "max_tokens": 4, "temperature": 0.0}
        enqueue_many(client, [job])
        done = wait_terminal(client, ["tp-ok"], timeout_s=120)["tp-ok"]
        assert terminal(done)["type"] == "done"  # type: ignore[index]

        enqueue_many(client, [{"id": "tp-long", "prompt": "a b c", "max_tokens": 1000, "ignore_eos": True}])
        wait_until(lambda: read_events(client, "tp-long"), 120, "the long job's first event")
        (rank,) = _rank_pids(w.process.pid)
        os.kill(rank, signal.SIGKILL)
        code = w.process.wait(timeout=120)
        assert code != 0
        log = w.log.read_text()
        assert "tensor-parallel rank 1 exited with code -9" in log, log[-3000:]
        assert terminal(read_events(client, "tp-long")) is None  # unfinished: left for another worker
    finally:
        workers.stop_all()


def test_sigterm_to_the_process_group_drains_and_stops_the_ranks(tiny_model, redis_server, r, tmp_path):
    """SIGTERM to the worker and its rank (as a process-group signal would): the rank ignores it, the
    worker drains, exits 0 and its exit stops the rank."""
    workers = Workers(tiny_model, tmp_path)
    try:
        w = workers.spawn(redis_server.url, "tp-term", "--tensor-parallel-size", "2")
        w.wait_started(timeout_s=120)
        (rank,) = _rank_pids(w.process.pid)
        os.kill(rank, signal.SIGTERM)
        os.kill(w.process.pid, signal.SIGTERM)
        assert w.process.wait(timeout=120) == 0, w.log.read_text()[-3000:]
        assert not Path(f"/proc/{rank}").exists()  # joined (reaped) by the worker before it exited
    finally:
        workers.stop_all()
