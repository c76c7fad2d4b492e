"""Issue 20: a job that kills its worker (a native crash) is dead-lettered alone; an innocent job that
shared its batch completes (worker/run/isolation.py).

The crash is worker/run/fault_injection.py's test-only hook: workers started with CONVEYOR_TEST_KILL_JOB=poison
SIGKILL themselves in the step where job "poison" has tokens."""

from __future__ import annotations

import pytest

from tests.helpers.rel_helpers import (
    GROUP,
    K,
    assert_exactly_once,
    enqueue_many,
    expected_outputs,
    read_events,
    terminal,
    wait_until,
)

pytestmark = [pytest.mark.redis, pytest.mark.slow]
ARMED = {"CONVEYOR_TEST_KILL_JOB": "poison"}


@pytest.mark.timeout(280)
def test_only_the_job_that_kills_its_worker_is_dead_lettered(server, workers, model):
    r = server.client()
    jobs = [
        {"id": "poison", "prompt": "this job kills the worker", "max_tokens": 6, "temperature": 0},
        {"id": "innocent", "prompt": "this job shares its batch", "max_tokens": 6, "temperature": 0},
    ]
    args = ("--max-attempts", "1")
    enqueue_many(r, jobs)  # before the worker starts: both are read at once and share the first step
    first = workers.spawn(server.url, "w", *args, env=ARMED)
    wait_until(lambda: not first.alive(), 120, "the first worker to die")
    assert first.process.returncode == -9
    # Both were started in the batch that died: each has one attempt counted.
    assert r.hget(K.attempts, "poison") == b"1" and r.hget(K.attempts, "innocent") == b"1"
    for _ in range(4):  # restarted under the same name, as a supervisor would, until both have ended
        ended = [terminal(read_events(r, j["id"])) for j in jobs]
        if all(ended):
            break
        w = workers.spawn(server.url, "w", *args, env=ARMED)
        w.wait_started()
        wait_until(
            lambda w=w: not w.alive() or all(terminal(read_events(r, j["id"])) for j in jobs),
            120,
            "a crash or both ends",
        )
    poison, innocent = (read_events(r, j["id"]) for j in jobs)
    assert terminal(poison) == {**terminal(poison), "type": "error", "code": "too_many_attempts"}
    assert terminal(innocent)["type"] == "done"
    chk = assert_exactly_once("innocent", innocent)
    tokens, text = expected_outputs(model, [jobs[1]])["innocent"]
    assert chk.tokens == tokens and terminal(innocent)["text"] == text
    dead = r.xrange(K.dead)
    assert [f[b"id"] for _, f in dead] == [b"poison"]
    wait_until(lambda: r.xpending(K.requests, GROUP)["pending"] == 0, 10, "no pending entries")
    assert r.hlen(K.attempts) == 0
