"""Issue #5: idempotent intake and size limits, against two live worker processes sharing one group."""

from __future__ import annotations

import pytest

from tests.helpers.rel_helpers import (
    GROUP,
    K,
    Workers,
    assert_exactly_once,
    enqueue_many,
    expected_outputs,
    make_redis,
    read_events,
    redis_binary,
    wait_terminal,
    wait_until,
)
from worker.keys import JOB_FIELD

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
LIMITS = {"payload": 8192, "prompt": 48, "max_tokens": 2000}


@pytest.fixture(scope="module")
def pair(tmp_path_factory, model):
    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    folder = tmp_path_factory.mktemp("intake")
    server = make_redis(folder).start()
    pool = Workers(model, folder)
    args = ["--max-payload-bytes", str(LIMITS["payload"]), "--max-prompt-tokens", str(LIMITS["prompt"])]
    args += ["--max-tokens-limit", str(LIMITS["max_tokens"])]
    try:
        a, b = pool.spawn(server.url, "a", *args), pool.spawn(server.url, "b", *args)
        a.wait_started()
        b.wait_started()
        yield server, (a, b)
    finally:
        pool.stop_all()
        server.stop()


def settled(r) -> bool:
    """Every entry read and acknowledged."""
    info = [g for g in r.xinfo_groups(K.requests) if g["name"] == GROUP.encode()][0]
    return info["pending"] == 0 and info["lag"] == 0


def finished_count(workers, job_id: str) -> int:
    return sum(e.get("request_id") == job_id for w in workers for e in w.logged("job finished"))


def test_finished_id_is_not_run_again(pair, model):
    server, workers = pair
    r = server.client()
    job = {"id": "fin1", "prompt": "finish once", "max_tokens": 8, "temperature": 0}
    enqueue_many(r, [job])
    first = wait_terminal(r, ["fin1"], 30)["fin1"]
    assert_exactly_once("fin1", first)
    # The same job again, and the same id with other parameters: both acknowledged, neither run.
    enqueue_many(r, [job, {**job, "max_tokens": 12, "prompt": "something else"}])
    wait_until(lambda: settled(r), 20, "re-enqueued entries acknowledged")
    assert read_events(r, "fin1") == first, "a finished job's stream must not change"
    assert finished_count(workers, "fin1") == 1
    assert not r.exists(K.owner("fin1"))
    # No bookkeeping left behind: a duplicate's +1/-1 on the attempt counter must not outlive the job.
    assert r.hget(K.attempts, "fin1") is None, f"attempts[fin1] left at {r.hget(K.attempts, 'fin1')}"
    assert all(f.get(b"id") != b"fin1" for _, f in r.xrange(K.dead)), "a duplicate is not an error"


def test_duplicate_enqueue_of_a_running_id_gives_one_generation(pair, model):
    server, workers = pair
    r = server.client()
    job = {"id": "run1", "prompt": "running twice?", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
    enqueue_many(r, [job])
    wait_until(lambda: r.xlen(K.out("run1")) >= 3, 30, "the job streaming")
    enqueue_many(r, [job, job, job])  # whichever worker reads these, the running job must not start again
    events = wait_terminal(r, ["run1"], 60)["run1"]
    chk = assert_exactly_once("run1", events)
    assert chk.end["type"] == "done" and chk.end["usage"]["completion_tokens"] == 1500
    assert chk.tokens == expected_outputs(model, [job])["run1"][0]
    wait_until(lambda: settled(r), 20, "duplicates acknowledged")
    assert finished_count(workers, "run1") == 1, "two generations of one id"
    assert not r.hexists(K.attempts, "run1")


def _refused(r, entry_id: bytes) -> dict:
    return wait_until(
        lambda: next((f for _, f in r.xrange(K.dead) if f[b"entry_id"] == entry_id), None), 20, "dead letter"
    )


@pytest.mark.parametrize(
    ("job", "code", "limit"),
    [
        (
            {"id": "lim-prompt", "prompt": " ".join(["word"] * 400), "max_tokens": 4},
            "prompt_too_long",
            "prompt",
        ),
        ({"id": "lim-ids", "prompt_token_ids": [5] * 49, "max_tokens": 4}, "prompt_too_long", "prompt"),
        ({"id": "lim-max", "prompt": "x", "max_tokens": 2001}, "max_tokens_too_large", "max_tokens"),
    ],
)
def test_limits_give_a_clear_error(pair, job, code, limit):
    server, _ = pair
    r = server.client()
    (entry,) = enqueue_many(r, [job])
    events = wait_terminal(r, [job["id"]], 20)[job["id"]]
    assert len(events) == 1 and events[0]["type"] == "error" and events[0]["code"] == code
    assert str(LIMITS[limit]) in events[0]["message"], events[0]["message"]
    dead = _refused(r, entry)
    assert dead[b"code"] == code.encode() and dead[b"id"] == job["id"].encode()
    assert str(LIMITS[limit]).encode() in dead[b"reason"]


def test_payload_too_large_is_dead_lettered_with_the_limit(pair):
    server, workers = pair
    r = server.client()
    entry = r.xadd(K.requests, {JOB_FIELD: b'{"id": "lim-bytes", "prompt": "' + b"y" * 9000 + b'"}'})
    dead = _refused(r, entry)
    assert dead[b"code"] == b"payload_too_large"
    assert b"8192" in dead[b"reason"] and len(dead[b"job"]) <= LIMITS["payload"]
    assert all(w.alive() for w in workers)


def test_payload_too_large_tells_the_client(pair):
    """The client that enqueued an oversized job must get a terminal event, not wait until its timeout.

    Fails today: check_payload raises before any id is known, so nothing is written to conveyor:out:<id>.
    """
    server, _ = pair
    r = server.client()
    r.xadd(K.requests, {JOB_FIELD: b'{"id": "lim-bytes2", "prompt": "' + b"y" * 9000 + b'"}'})
    events = wait_terminal(r, ["lim-bytes2"], 8)["lim-bytes2"]
    assert events[-1]["type"] == "error" and events[-1]["code"] == "payload_too_large"
