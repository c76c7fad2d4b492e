"""Issue #5: Redis stops and starts again mid-run. Workers reconnect, nothing acknowledged is lost.

The server runs with `--appendonly yes --appendfsync always` in its own folder and is killed with -9:
every write Redis acknowledged (a job's XADD, a published event, an XACK) is on disk before the reply, so
after the restart it must still be there. Writes that never got a reply may or may not have landed; the
workers retry those rounds, and explicit event ids make a retried write land at most once.
"""

from __future__ import annotations

import signal
import time

import pytest

from tests.helpers.rel_helpers import (
    GROUP,
    K,
    assert_exactly_once,
    enqueue_many,
    expected_outputs,
    greedy_or_sampled,
    read_events,
    terminal,
    wait_terminal,
    wait_until,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def _job(job_id: str, k: int, max_tokens: int) -> dict:
    return greedy_or_sampled(job_id, f"restart job {k}", max_tokens, k, {"temperature": 0.8, "seed": 77 + k})


@pytest.mark.timeout(150)
def test_redis_killed_and_restarted_mid_run(redis_factory, workers, model):
    server = redis_factory(aof=True)
    r = server.client(socket_timeout=5)
    a = workers.spawn(server.url, "a", "--max-num-seqs", "12")
    b = workers.spawn(server.url, "b", "--max-num-seqs", "12")
    a.wait_started()
    b.wait_started()

    # Finished before the outage: acknowledged, so never run again afterwards.
    early = [_job(f"early{k}", k, 8) for k in range(6)]
    early_entries = enqueue_many(r, early)
    before = wait_terminal(r, [j["id"] for j in early], 30)
    wait_until(lambda: r.xpending(K.requests, GROUP)["pending"] == 0, 10, "early jobs acknowledged")

    # In flight during the outage.
    long = [_job(f"long{k}", k, 700) for k in range(16)]
    long_entries = enqueue_many(r, long)
    wait_until(lambda: all(r.xlen(K.out(j["id"])) >= 2 for j in long), 60, "every long job streaming")
    seen = {j["id"]: read_events(r, j["id"]) for j in long}  # what clients have read so far
    r.close()
    server.stop(signal.SIGKILL)
    time.sleep(2.0)  # longer than the lease: owner keys lapse, pending entries look idle on return
    assert a.alive() and b.alive(), "workers must survive Redis going away"
    server.start()
    r = server.client(socket_timeout=5)

    # Every acknowledged job entry survived the restart.
    stream_ids = {eid for eid, _ in r.xrange(K.requests)}
    assert set(early_entries) | set(long_entries) <= stream_ids
    assert sum(terminal(ev) is None for ev in seen.values()) >= 8, "the outage hit too few running jobs"

    # Workers reconnected: new jobs after the restart are served too.
    late = [_job(f"late{k}", k, 12) for k in range(6)]
    enqueue_many(r, late)
    jobs = long + late
    results = wait_terminal(r, [j["id"] for j in jobs], 90)
    expected = expected_outputs(model, jobs)
    for job in jobs:
        events = results[job["id"]]
        chk = assert_exactly_once(job["id"], events)
        assert chk.end["type"] == "done", (job["id"], chk.end)
        assert chk.tokens == expected[job["id"]][0], f"{job['id']}: tokens differ from an uninterrupted run"
        assert chk.end["text"] == expected[job["id"]][1]
        if job["id"] in seen:  # events a client read before the outage are still there, in order
            assert events[: len(seen[job["id"]])] == seen[job["id"]], job["id"]
    # Jobs finished before the outage were not run again.
    for job in early:
        assert read_events(r, job["id"]) == before[job["id"]], job["id"]
    wait_until(lambda: r.xpending(K.requests, GROUP)["pending"] == 0, 15, "all entries acknowledged")
    assert a.alive() and b.alive()
    finished = [e["request_id"] for w in (a, b) for e in w.logged("job finished")]
    assert sorted(set(finished) & {j["id"] for j in early}) == sorted(j["id"] for j in early)
    assert all(finished.count(j["id"]) == 1 for j in early), "an acknowledged job ran twice"
