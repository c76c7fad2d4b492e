"""The lease fence of a batch's answers (worker/batch/redis_sink.py, batch_lease.py) on a real redis-server."""

from __future__ import annotations

import time

import pytest

from worker.batch.batch_lease import BatchLease
from worker.batch.batch_store import BatchStore, LeaseLost
from worker.batch.redis_sink import CANCELLED, EXPIRED, RedisSink
from worker.keys import Keys

pytestmark = pytest.mark.redis
K = Keys()


def _batch(r) -> tuple[str, BatchLease]:
    batch_id = BatchStore(r, K).create("t", "file-x", "/v1/completions", "1h").id
    lease = BatchLease(r, K.batch(batch_id, "lease"), 60_000, "replica-a")
    assert lease.acquire()
    assert not BatchLease(r, K.batch(batch_id, "lease"), 60_000, "replica-b").acquire()  # one holder
    return batch_id, lease


def test_each_custom_id_is_written_once(r):
    batch_id, lease = _batch(r)
    sink = RedisSink(r, K, batch_id, lease, expires_at=int(time.time()) + 3600)
    sink.started(3, 0)
    sink.write("a", "line a\n", True, 4)
    sink.write("a", "line a again\n", True, 4)  # a second answer (a takeover's) is dropped
    sink.write("b", "line b\n", False, 0)
    assert r.lrange(K.batch(batch_id, "output"), 0, -1) == [b"line a\n"]
    assert r.lrange(K.batch(batch_id, "errors"), 0, -1) == [b"line b\n"]
    counts = BatchStore(r, K).get("t", batch_id).request_counts  # type: ignore[union-attr]
    assert (counts.total, counts.completed, counts.failed) == (3, 1, 1)
    assert sink.answered().custom_ids == {"a", "b"}


def test_a_replica_that_lost_its_lease_writes_nothing(r):
    batch_id, lease = _batch(r)
    sink = RedisSink(r, K, batch_id, lease, expires_at=int(time.time()) + 3600, check_every_s=0)
    r.set(lease.key, "replica-b:token")  # the lease expired and another replica took it
    with pytest.raises(LeaseLost):
        sink.write("a", "line a\n", True, 4)
    with pytest.raises(LeaseLost):  # nor does it move the batch's status
        BatchStore(r, K).move(batch_id, {"validating"}, {"status": "failed"}, (lease.key, lease.token))
    assert not r.exists(K.batch(batch_id, "output"), K.batch(batch_id, "answered"))
    assert BatchStore(r, K).get("t", batch_id).status == "validating"  # type: ignore[union-attr]
    lease.release()  # not its lease: left alone
    assert r.get(lease.key) == b"replica-b:token"


def test_stop_reasons(r):
    batch_id, lease = _batch(r)
    sink = RedisSink(r, K, batch_id, lease, expires_at=int(time.time()) + 3600, check_every_s=0)
    assert sink.stop() is None
    BatchStore(r, K).cancel("t", batch_id)
    assert sink.stop() is CANCELLED
    other, lease2 = _batch(r)
    assert RedisSink(r, K, other, lease2, expires_at=int(time.time()) - 1).stop() is EXPIRED
