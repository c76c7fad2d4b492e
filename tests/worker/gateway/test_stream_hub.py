"""StreamHub against a real Redis: a request gets its events in the batches one XREAD returned (so the
chunks of a batch go out in one write), up to the terminal event, and TimeoutError at its deadline."""

from __future__ import annotations

import asyncio
import json

import pytest
import redis.asyncio as aioredis

from worker.gateway.stream_hub import StreamHub
from worker.keys import EVENT_FIELD, Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(60)]


def _token(k: int) -> dict:
    return {"type": "token", "index": k, "token_ids": [k], "text": str(k)}


async def _with_hub(url: str, body) -> None:
    client = aioredis.Redis.from_url(url)
    keys = Keys(prefix="hubtest")
    hub = StreamHub(client, keys, block_ms=1000)
    reader = asyncio.create_task(hub.run())
    try:
        await body(client, keys, hub)
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


def test_events_come_in_the_batches_read_and_end_at_the_terminal_one(redis_server):
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
        assert not hub._queues and not hub._last  # the request is forgotten

    asyncio.run(_with_hub(redis_server.url, body))


def test_a_request_with_no_events_times_out_at_its_deadline(redis_server):
    async def body(client, keys, hub) -> None:
        loop = asyncio.get_running_loop()
        started = loop.time()
        batches = hub.follow(keys, "quiet", started + 0.3)
        with pytest.raises(TimeoutError):
            await anext(batches)
        assert loop.time() - started >= 0.3 - 0.01  # not before (the timer is the loop's own clock)
        assert not hub._queues and not hub._last

    asyncio.run(_with_hub(redis_server.url, body))
