"""A non-terminal write that Redis refuses, through the real WRITE script on a real redis-server.

A successor that took the job over and wrote first leaves entry ids at or above ours on the output stream,
so our XADD is refused ("equal or smaller"). A worker that never lost its connection (a first try, not a
retried round) cannot have written those entries itself: it must drop the job. Only a round sent again
after a dropped connection may read the conflict as its own earlier write having landed.
"""

from __future__ import annotations

import time

import pytest

from worker.config import WorkerConfig
from worker.keys import EVENT_FIELD
from worker.protocol import Job
from worker.publish.publisher import Batch, Publisher
from worker.wire.exchange import execute
from worker.wire.job_record import InFlight
from worker.wire.round import Round

pytestmark = pytest.mark.redis


def in_flight(job_id: str, next_seq: int) -> InFlight:
    now = time.time() * 1000
    return InFlight(Job(id=job_id, prompt="p"), b"1-0", now, now, n=1, next_seq=next_seq)


def publish_once(r, cfg: WorkerConfig, job: InFlight, retried: bool) -> list[InFlight]:
    """One round with one token event for `job`; returns the jobs the publisher dropped."""
    lost: list[InFlight] = []
    publisher = Publisher(on_lost=lost.append, on_full=lambda message: None, on_acked=lambda job: None)
    batch = Batch(cfg)
    batch.add(job, [b'{"type": "token"}'])
    rnd = Round()
    rnd.retried = retried
    publisher.add(rnd, batch)
    rnd.dispatch(execute(r, rnd))
    assert not publisher.owed, "nothing to send again: the refusal is final"
    return lost


def successor_wrote(r, cfg: WorkerConfig, job_id: str, upto: int) -> None:
    for seq in range(1, upto + 1):
        r.xadd(cfg.keys.out(job_id), {EVENT_FIELD: b'{"type": "token"}'}, id=f"0-{seq}")


@pytest.mark.parametrize("retried", [False, True])
def test_a_refused_token_write_drops_the_job_unless_the_round_was_sent_again(r, retried):
    cfg = WorkerConfig(group="test", consumer="stale")
    job = in_flight("j", next_seq=3)  # we wrote 0-1 and 0-2, then our lease lapsed
    successor_wrote(r, cfg, "j", upto=5)
    lost = publish_once(r, cfg, job, retried)
    assert r.xlen(cfg.keys.out("j")) == 5, "the successor's history is untouched"
    if retried:
        assert lost == [], "after a dropped connection the conflict may be our own landed write"
    else:
        assert lost == [job], "a first try refused means another worker owns the stream: drop the job"


def test_an_accepted_token_write_keeps_the_job(r):
    cfg = WorkerConfig(group="test", consumer="live")
    job = in_flight("k", next_seq=3)
    successor_wrote(r, cfg, "k", upto=2)
    assert publish_once(r, cfg, job, retried=False) == []
    assert [entry_id for entry_id, _ in r.xrange(cfg.keys.out("k"))][-1] == b"0-3"
