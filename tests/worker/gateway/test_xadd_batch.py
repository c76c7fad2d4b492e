"""XaddBatch against a real Redis: the jobs submitted in one turn of the loop go in one pipeline, and each
request gets its own outcome (its entry id, its command's error, the connection's error)."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis
import redis.asyncio as aioredis

from worker.gateway.xadd_batch import XaddBatch

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


class Counting:
    """The client, counting the pipelines made from it."""

    def __init__(self, client) -> None:
        self.client, self.pipelines = client, 0

    def pipeline(self, **kw):
        self.pipelines += 1
        return self.client.pipeline(**kw)


def test_one_turns_jobs_go_in_one_pipeline_and_each_gets_its_own_outcome(redis_server):
    async def run() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        stream, wrong = f"xb-{uuid.uuid4().hex}", f"xb-str-{uuid.uuid4().hex}"
        await client.set(wrong, "not a stream")
        counting = Counting(client)
        batch = XaddBatch(counting)
        try:
            sends = [batch.xadd(stream, {"job": str(k)}) for k in range(5)]
            outcomes = await asyncio.gather(*sends, batch.xadd(wrong, {"job": "x"}), return_exceptions=True)
            assert counting.pipelines == 1
            assert isinstance(outcomes[-1], redis.ResponseError)  # WRONGTYPE: that request's alone
            entries = await client.xrange(stream)
            assert [e[0] for e in entries] == outcomes[:5]  # each its own id, in order
            assert [e[1][b"job"] for e in entries] == [str(k).encode() for k in range(5)]
            await batch.xadd(stream, {"job": "later"})  # a later turn: a pipeline of its own
            assert counting.pipelines == 2
        finally:
            await client.aclose()

    asyncio.run(run())


def test_a_lost_connection_is_each_requests_error(redis_server):
    async def run() -> None:
        client = aioredis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1)  # nothing listens
        batch = XaddBatch(client)
        outcomes = await asyncio.gather(
            *(batch.xadd("s", {"a": "1"}) for _ in range(3)), return_exceptions=True
        )
        assert all(isinstance(o, redis.ConnectionError) for o in outcomes), outcomes
        await client.aclose()

    asyncio.run(run())


def test_a_request_cancelled_before_the_flush_sends_no_job_and_stops_no_other(redis_server):
    async def run() -> None:
        client = aioredis.Redis.from_url(redis_server.url)
        stream = f"xb-{uuid.uuid4().hex}"
        batch = XaddBatch(client)
        try:
            first = asyncio.ensure_future(batch.xadd(stream, {"job": "gone"}))
            second = asyncio.ensure_future(batch.xadd(stream, {"job": "kept"}))
            await asyncio.sleep(0)  # both wait in this turn's batch
            first.cancel()
            assert await second
            entries = await client.xrange(stream)
            assert [e[1][b"job"] for e in entries] == [b"kept"]  # cancelled before the flush: not sent
        finally:
            await client.aclose()

    asyncio.run(run())
