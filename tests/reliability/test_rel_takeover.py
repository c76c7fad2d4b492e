"""Issue #5: a worker killed with -9 mid-generation; its jobs are taken over and resumed, attempts counted."""

from __future__ import annotations

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


def _jobs(prefix: str, count: int, max_tokens: int) -> list[dict]:
    """Half greedy, half seeded sampling: both must continue exactly after a takeover."""
    return [
        greedy_or_sampled(
            f"{prefix}{k}",
            f"crash test job {k}",
            max_tokens,
            k,
            {"temperature": 0.9, "top_k": 40, "seed": 1000 + k},
        )
        for k in range(count)
    ]


@pytest.mark.timeout(150)
def test_kill9_with_20_in_flight_second_worker_finishes_all_exactly_once(server, workers, model):
    r = server.client()
    a = workers.spawn(server.url, "a", "--max-num-seqs", "20")
    b = workers.spawn(server.url, "b", "--max-num-seqs", "20")
    a.wait_started()
    b.wait_started()
    jobs = _jobs("k", 40, 600)
    entry_to_id = dict(zip(enqueue_many(r, jobs), (j["id"] for j in jobs), strict=True))

    def per_consumer() -> dict[bytes, list[str]]:
        rows = r.xpending_range(K.requests, GROUP, "-", "+", 100)
        out: dict[bytes, list[str]] = {}
        for row in rows:
            out.setdefault(row["consumer"], []).append(entry_to_id[row["message_id"]])
        return out

    def victim_ready():
        # A worker with 20 jobs in flight, each already streaming and none finished.
        for consumer, ids in per_consumer().items():
            if len(ids) == 20:
                lens = [r.xlen(K.out(i)) for i in ids]
                if min(lens) >= 2:
                    return consumer, ids
        return None

    consumer, victim_ids = wait_until(victim_ready, 60, "a worker with 20 jobs streaming")
    victim = a if consumer == b"a" else b
    survivor = b if victim is a else a
    victim.kill9()
    at_kill = {i: read_events(r, i) for i in victim_ids}
    unfinished = [i for i, ev in at_kill.items() if terminal(ev) is None]
    assert len(unfinished) >= 10, "the victim finished its jobs before the kill: the test proves nothing"
    assert survivor.alive()

    results = wait_terminal(r, [j["id"] for j in jobs], 90)
    expected = expected_outputs(model, jobs)
    for job in jobs:
        events = results[job["id"]]
        chk = assert_exactly_once(job["id"], events)
        assert chk.end["type"] == "done" and chk.end["finish_reason"] == "length", job["id"]
        want_tokens, want_text = expected[job["id"]]
        assert chk.tokens == want_tokens, f"{job['id']}: tokens differ from an uninterrupted run"
        assert chk.end["text"] == want_text, job["id"]
        # What a client read before the crash is a prefix of what it reads now (the stream was continued).
        if job["id"] in at_kill:
            assert events[: len(at_kill[job["id"]])] == at_kill[job["id"]], job["id"]
    resumed = {e["request_id"] for e in survivor.logged("job resumed")}
    assert set(unfinished) <= resumed, "every unfinished job of the victim is resumed, not restarted"
    wait_until(lambda: r.xpending(K.requests, GROUP)["pending"] == 0, 10, "no pending entries")
    assert r.hlen(K.attempts) == 0


@pytest.mark.timeout(150)
def test_attempts_count_crashes_then_dead_letter_with_error_event(server, workers, model):
    """max_attempts=2: started, killed, resumed, killed; the third start refuses it as too_many_attempts."""
    r = server.client()
    job = {
        "id": "doomed",
        "prompt": "crash me twice",
        "max_tokens": 2000,
        "ignore_eos": True,
        "temperature": 0,
    }
    args = ("--max-attempts", "2")
    lengths = []
    for attempt in (1, 2):
        w = workers.spawn(server.url, "crashy", *args)
        w.wait_started()
        if attempt == 1:
            enqueue_many(r, [job])
        before = r.xlen(K.out("doomed"))
        wait_until(lambda b=before: r.xlen(K.out("doomed")) >= b + 3, 60, "new tokens")
        w.kill9()
        assert terminal(read_events(r, "doomed")) is None, "the job finished before the kill"
        assert r.hget(K.attempts, "doomed") == str(attempt).encode(), "a crashed attempt is counted"
        lengths.append(r.xlen(K.out("doomed")))
    w = workers.spawn(server.url, "crashy", *args)
    w.wait_started()
    events = wait_terminal(r, ["doomed"], 30)["doomed"]
    end = events[-1]
    assert end["type"] == "error" and end["code"] == "too_many_attempts", end
    assert "2" in end["message"]
    chk = assert_exactly_once("doomed", events)
    # Attempt 2 continued attempt 1's stream (no restart from index 0), and attempt 3 wrote no token.
    assert len(chk.tokens) == sum(len(e["token_ids"]) for e in events if e["type"] == "token")
    assert len(events) == lengths[-1] + 1
    expected_tokens, _ = expected_outputs(model, [job])["doomed"]
    assert chk.tokens == expected_tokens[: len(chk.tokens)]
    dead = r.xrange(K.dead)
    assert len(dead) == 1
    fields = dead[0][1]
    assert fields[b"code"] == b"too_many_attempts" and fields[b"id"] == b"doomed" and fields[b"reason"]
    assert r.xpending(K.requests, GROUP)["pending"] == 0
    assert not r.hexists(K.attempts, "doomed") and not r.exists(K.owner("doomed"))
    assert w.alive()
