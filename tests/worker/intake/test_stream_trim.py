"""Trimming the requests stream never removes an entry that a consumer group still needs."""

from __future__ import annotations

import pytest

from tests.helpers.worker_fakes import FakeEngine, running_worker, wait_until
from worker.client import collect, enqueue
from worker.intake.stream_trim import Trimmer
from worker.keys import Keys
from worker.wire.exchange import execute
from worker.wire.round import Round

pytestmark = pytest.mark.redis
K = Keys()


def trim(r) -> None:
    rnd = Round()
    Trimmer(K.requests).add(rnd)
    rnd.dispatch(execute(r, rnd))


def ids(r) -> list[bytes]:
    return [eid for eid, _ in r.xrange(K.requests)]


def test_trims_below_the_oldest_entry_any_group_still_needs(r):
    entries = [enqueue(r, {"id": f"t{k}", "prompt": "x"}) for k in range(6)]
    r.xgroup_create(K.requests, "fast", id="0")
    r.xgroup_create(K.requests, "slow", id="0")
    for eid, _ in r.xreadgroup("fast", "a", {K.requests: ">"})[0][1]:
        r.xack(K.requests, "fast", eid)
    # "slow" has read three, finished the first and third: the second is pending, three not yet delivered.
    r.xreadgroup("slow", "b", {K.requests: ">"}, count=3)
    r.xack(K.requests, "slow", entries[0], entries[2])
    trim(r)
    assert ids(r) == entries[1:], "kept from slow's pending entry on"
    r.xack(K.requests, "slow", entries[1])
    trim(r)
    assert ids(r) == entries[3:], "kept what slow has not been delivered yet"
    for eid, _ in r.xreadgroup("slow", "b", {K.requests: ">"})[0][1]:
        r.xack(K.requests, "slow", eid)
    trim(r)
    assert ids(r) == []


def test_no_group_no_trim(r):
    entries = [enqueue(r, {"id": f"t{k}", "prompt": "x"}) for k in range(3)]
    trim(r)
    assert ids(r) == entries


@pytest.mark.timeout(60)
def test_the_worker_trims_what_every_group_has_finished(redis_server, r):
    """Another model's group lags behind: the worker's trimming leaves everything that group needs."""
    r.xgroup_create(K.requests, "other-model", id="0", mkstream=True)
    with running_worker(FakeEngine(), redis_server.url) as worker:
        worker.lanes[0].trimmer.every_s = 0.0  # every round
        entries = [enqueue(r, {"id": f"w{k}", "prompt": "x", "max_tokens": 3}) for k in range(4)]
        for k in range(4):
            collect(r, f"w{k}", timeout_s=10)
        wait_until(lambda: r.xpending(K.requests, "test")["pending"] == 0, 10, "the acks")
        ((eid, _),) = r.xreadgroup("other-model", "o", {K.requests: ">"}, count=1)[0][1]
        r.xack(K.requests, "other-model", eid)
        enqueue(r, {"id": "last", "prompt": "x", "max_tokens": 3})  # a round or two after the ack
        collect(r, "last", timeout_s=10)
        wait_until(lambda: ids(r)[:1] == entries[1:2], 10, "the trim of the entry both groups finished")
    assert ids(r)[: len(entries) - 1] == entries[1:]
