"""A job's Redis side, from the gateway: submit it to its model's stream (with the queue limit), follow its
output stream, cancel it. docs/protocol.md describes each key; worker/keys.py names them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis
import structlog

from worker.affinity_key import with_affinity
from worker.cluster.shard_keys import keys_of_shard_stream
from worker.connection import Backoff
from worker.gateway.errors import queue_full
from worker.gateway.fleet_view import ServedModel
from worker.intake.lane_layout import read_layout_async
from worker.keys import EVENT_FIELD, JOB_FIELD, Keys
from worker.protocol import NOT_AN_EVENT, TERMINAL, Event, Job, read_event

CANCEL_TTL_S = 600  # as docs/protocol.md "Cancelling" writes it
LOST = (redis.ConnectionError, redis.TimeoutError, ConnectionError, OSError)
log = structlog.get_logger("conveyor.gateway")


async def queued(client, stream: str, groups: list[str]) -> int:
    """Jobs on `stream` not yet read by the model's group(s) (XINFO GROUPS' lag; the stream's length when
    Redis cannot tell the lag, after entries were deleted)."""
    try:
        infos = await client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream yet: nothing queued
        return 0
    lags = []
    for info in infos:
        name = info.get("name", b"")
        if (name.decode() if isinstance(name, bytes) else name) in groups:
            lag = info.get("lag")
            lags.append(int(lag) if lag is not None else int(await client.xlen(stream)))
    return max(lags, default=0)


async def submit(
    client,
    keys: Keys,
    model: ServedModel,
    job: Job,
    max_queued: int,
    retry_after_s: int,
    xadd: Callable[[str, dict], Awaitable[Any]] | None = None,
) -> str:
    """XADD the job to its stream among its model's (ServedModel.stream_for, after the default affinity key
    is set: jobs sharing a prompt prefix go to the same workers, docs/protocol.md); 429 (APIError) when
    max_queued jobs wait there. Returns the stream. `xadd`: how to send it (XaddBatch.xadd, with other
    requests' jobs), instead of the client's own XADD."""
    fields = with_affinity(job.wire())
    layout_keys = model.layout_keys(keys.prefix)
    layout = await read_layout_async(client, layout_keys) if layout_keys is not None else None
    stream = model.stream_for(fields, keys.prefix, layout)
    if layout is not None and (tenant := layout.unnamed_tenant(fields)) is not None:
        await client.sadd(layout.tenants_key, tenant)  # its lane is new to the workers: they add it
    if max_queued:
        waiting = await queued(client, stream, model.groups)
        if waiting >= max_queued:
            raise queue_full(model.name, waiting, retry_after_s)
    await (xadd or client.xadd)(stream, {JOB_FIELD: json.dumps(fields)})
    return stream


def until_terminal(entries: list) -> list[Event]:
    """The events of one read's entries of an output stream, up to its terminal event (nothing follows
    one; were something there, no reader should see it). An entry that is not an event (no worker writes
    one) ends the answer there with NOT_AN_EVENT, a 500."""
    events = []
    for _, fields in entries:
        event = read_event(fields.get(EVENT_FIELD))
        if event is NOT_AN_EVENT:
            log.error("an output stream's entry is not an event", entry=repr(fields)[:200])
        events.append(event)
        if event.type in TERMINAL:
            break
    return events


async def follow(
    client, keys: Keys, job_id: str, block_ms: int, deadline: float | None
) -> AsyncIterator[list[Event]]:
    """The job's events in order, in the batches the reads returned, ending with the batch holding the
    terminal event, read from its output stream from the last entry seen: events written before this
    call, a lost connection, or a worker taken over mid-job (its successor writes the next index) lose
    nothing. Raises TimeoutError at `deadline` (loop time; None: none)."""
    loop = asyncio.get_running_loop()
    key, last = keys.out(job_id), b"0"
    backoff = Backoff()
    while True:
        left_s = float("inf") if deadline is None else deadline - loop.time()
        if left_s <= 0:
            raise TimeoutError(job_id)
        try:
            reply: Any = await client.xread(
                {key: last}, block=max(1, int(min(block_ms, left_s * 1000))), count=1000
            )
        except redis.AuthenticationError:
            raise
        except LOST:
            await asyncio.sleep(min(backoff.next_delay(), left_s))
            continue
        backoff.reset()
        if not reply:
            continue
        entries = reply[0][1]
        last = entries[-1][0]
        batch = until_terminal(entries)
        yield batch
        if batch[-1].type in TERMINAL:
            return


async def cancel(client, keys: Keys, job_id: str, sharded: bool = False) -> None:
    """The key is checked before the job starts and every step; the message reaches a running job at once
    (sharded pub/sub in a Redis Cluster, as the workers listen there)."""
    await client.set(keys.cancel(job_id), 1, ex=CANCEL_TTL_S)
    if sharded:
        await client.spublish(keys.cancel_channel, job_id)
    else:
        await client.publish(keys.cancel_channel, job_id)


def keys_of_stream(keys: Keys, stream: str) -> Keys:
    """The names of a job submitted to `stream`: the deployment's, or for a shard's stream (protocol
    version 2, in a cluster or on one Redis) the shard's, so its output stream is under the same hash tag."""
    return keys_of_shard_stream(keys.prefix, stream) or keys
