"""The two ways a request follows its output stream, against a real Redis: StreamHub (one XREAD for all
of a process's requests) and job_io.follow (one per request, in cluster mode). Either gives the events in
the batches one XREAD returned (so the chunks of a batch go out in one write), up to the terminal event,
and TimeoutError at the deadline."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import redis.asyncio as aioredis

from worker.gateway import job_io
from worker.gateway.stream_hub import StreamHub
from worker.keys import EVENT_FIELD, Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _token(k: int) -> dict:
    return {"type": "token", "index": k, "token_ids": [k], "text": str(k)}


class OnePerRequest:
    """job_io.follow, shaped as StreamHub.follow."""

    def __init__(self, client) -> None:
        self.client = client

    def follow(self, keys: Keys, job_id: str, deadline: float):
        return job_io.follow(self.client, keys, job_id, 100, deadline)


async def _with_hub(url: str, body, kind: str) -> None:
    client = aioredis.Redis.from_url(url)
    keys = Keys(prefix=f"hubtest-{uuid.uuid4().hex}")  # the module's Redis is shared by its tests
    hub = StreamHub(client, keys, block_ms=1000)
    reader = asyncio.create_task(hub.run())
    try:
        await body(client, keys, hub if kind == "hub" else OnePerRequest(client))
    finally:
        # A cancel that lands inside redis-py's XREAD is sometimes swallowed there (seen with redis-py 8.1,
        # the reader then goes on blocking): cancel until it stops.
        while not reader.done():
            reader.cancel()
            await asyncio.wait({reader}, timeout=0.5)
        await client.aclose()


async def _add(client, keys: Keys, job_id: str, events: list[dict]) -> None:
    pipe = client.pipeline(transaction=True)  # all at once, as a worker publishes a step (one script)
    for event in events:
        pipe.xadd(keys.out(job_id), {EVENT_FIELD: json.dumps(event)})
    await pipe.execute()


@pytest.mark.parametrize("kind", ["hub", "one-per-request"])
def test_events_come_in_the_batches_read_and_end_at_the_terminal_one(redis_server, kind):
    async def body(client, keys, hub) -> None:
        done = {"type": "done", "finish_reason": "length", "usage": {}}
        await _add(client, keys, "j1", [_token(0), _token(1), _token(2)])  # before the request follows
        deadline = asyncio.get_running_loop().time() + 30
        batches = hub.follow(keys, "j1", deadline)
        assert await anext(batches) == [_token(0), _token(1), _token(2)]
        await _add(client, keys, "j1", [_token(3)])
        assert await anext(batches) == [_token(3)]
        # Nothing follows a terminal event; were something there, it would not be handed out.
        await _add(client, keys, "j1", [_token(4), done, _token(5)])
        assert [batch async for batch in batches] == [[_token(4), done]]
        if kind == "hub":
            assert not hub._queues and not hub._last  # the request is forgotten

    asyncio.run(_with_hub(redis_server.url, body, kind))


@pytest.mark.parametrize("kind", ["hub", "one-per-request"])
def test_a_request_with_no_events_times_out_at_its_deadline(redis_server, kind):
    async def body(client, keys, hub) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        batches = hub.follow(keys, "quiet", started + 0.3)
        with pytest.raises(TimeoutError):
            await anext(batches)
        assert loop.time() - started >= 0.3 - 0.01  # not before (the timer is the loop's own clock)
        if kind == "hub":
            assert not hub._queues and not hub._last

    asyncio.run(_with_hub(redis_server.url, body, kind))
