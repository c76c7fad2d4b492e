"""A small client: enqueue a job, then read its events from the output stream (replay, then follow).

Used by `conveyor submit`, the demo, the benchmark and the tests. Reading the stream from `0` means a
client that starts reading late still sees every event, and one that lost its connection (a Redis
restart, a read that timed out on a frozen network) goes on from the last entry id it has seen.

`events` reads on a pool of its own, made like the given client's but without redis-py's retries (a
default client repeats a timed-out read 3 times, so one call could last 4 socket timeouts) and with
socket waits no longer than `timeout_s`: the whole call, connecting included, ends within about
`timeout_s`.
"""

from __future__ import annotations

import json
import time
import weakref
from collections.abc import Iterator
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from worker.affinity_key import with_affinity
from worker.cluster.shard_keys import ShardedKeys
from worker.connection import Backoff
from worker.intake.lane_layout import LaneLayout, read_layout, register_tenant
from worker.keys import EVENT_FIELD, JOB_FIELD, Keys
from worker.shard_choice import choose_shard

_DEFAULT_BLOCK_MS = 5000
_UNSET = object()
LAYOUT_TTL_S = 2.0  # a client reads the workers' lane layout again after this long
# Per client: lane layout key -> (monotonic time read, the layout or None).
_layouts: weakref.WeakKeyDictionary[redis.Redis, dict[str, tuple[float, LaneLayout | None]]] = (
    weakref.WeakKeyDictionary()
)


def enqueue(client: redis.Redis, job: dict, keys: Keys | None = None, affinity: bool = True) -> bytes:
    """XADD the job to the stream it belongs in (`request_stream`); returns the entry id. With `affinity`,
    a job without an `affinity` key gets the default one (worker/affinity_key.py), so that the jobs sharing
    a prompt prefix go to the same workers."""
    keys = keys or Keys()
    if affinity:
        job = with_affinity(job)
    stream = request_stream(client, job, keys)
    entry_id: bytes = client.xadd(stream, {JOB_FIELD: json.dumps(job)})  # type: ignore[assignment]
    return entry_id


def request_stream(client: redis.Redis, job: dict, keys: Keys) -> str:
    """The requests stream, or, when the workers read priority or tenant lanes, the job's lane's stream
    (intake/lane_layout.py; the layout is read at most every LAYOUT_TTL_S per client)."""
    layout = lane_layout(client, keys)
    if layout is None:
        return keys.requests
    register_tenant(client, layout, job)  # a tenant with a lane of its own: the workers add it
    return layout.stream_for(job)


def lane_layout(client: redis.Redis, keys: Keys) -> LaneLayout | None:
    known = _layouts.setdefault(client, {})
    read_at, layout = known.get(keys.lane_layout, (-LAYOUT_TTL_S, None))
    if time.monotonic() - read_at >= LAYOUT_TTL_S:
        layout = read_layout(client, keys)
        known[keys.lane_layout] = (time.monotonic(), layout)
    return layout


def enqueue_sharded(client: redis.Redis, job: dict, sharded: ShardedKeys, affinity: bool = True) -> int:
    """Protocol version 2 on one Redis: add the job to its shard's request stream (shard_choice.py), with
    the default affinity key set first (unless `affinity` is False), so its key chooses the shard.
    Returns the shard; the job's events are read with `sharded.shard(<it>)`'s keys."""
    if affinity:
        job = with_affinity(job)
    shard = choose_shard(job, sharded.shards)  # (no lanes with shards: the shard's own stream)
    client.xadd(sharded.shard(shard).requests, {JOB_FIELD: json.dumps(job)})
    return shard


class NoAnswer(TimeoutError):
    """No terminal event within the call's timeout; the message says why (no worker, Redis lost...)."""


def _socket_timeout(pool: redis.ConnectionPool, name: str = "socket_timeout") -> float | None:
    # The connection's own default applies when the URL or kwargs do not set one (from_url leaves it out).
    timeout_s = pool.connection_kwargs.get(name, _UNSET)
    if timeout_s is _UNSET:
        timeout_s = getattr(pool.connection_class(**pool.connection_kwargs), name, None)
    return timeout_s


def read_block_ms(client: redis.Redis, wanted_ms: int = _DEFAULT_BLOCK_MS) -> int:
    """XREAD BLOCK must return before the client's socket timeout (redis-py 8 defaults it to 5 s), or the
    read fails with TimeoutError on a quiet stream: block for at most half of it."""
    timeout_s = _socket_timeout(client.connection_pool)
    if timeout_s is None:
        return wanted_ms
    return max(1, min(wanted_ms, int(timeout_s * 1000 / 2)))


def bounded_reader(client: redis.Redis, timeout_s: float) -> redis.Redis:
    """A client on a new pool like `client`'s: no redis-py retries, socket waits of at most timeout_s.
    Only for a plain ConnectionPool: a pool of another kind (worker/wire/slot_following.py's MasterPool,
    which follows its shard's master, a sentinel's) is used as it is, with its own timeouts and retries."""
    pool = client.connection_pool
    if type(pool) is not redis.ConnectionPool:
        return client
    kwargs = dict(pool.connection_kwargs)
    for name in ("socket_timeout", "socket_connect_timeout"):
        own = _socket_timeout(pool, name)
        kwargs[name] = timeout_s if own is None else min(own, timeout_s)
    kwargs["retry"] = Retry(NoBackoff(), 0)
    return redis.Redis(connection_pool=redis.ConnectionPool(connection_class=pool.connection_class, **kwargs))


def events(
    client: redis.Redis,
    job_id: str,
    keys: Keys | None = None,
    block_ms: int = _DEFAULT_BLOCK_MS,
    timeout_s: float = 300,
) -> Iterator[dict]:
    """Yield the job's events in order, ending after the terminal one. Raises NoAnswer (a TimeoutError)
    when no terminal event came within timeout_s; a lost connection or a read that timed out is retried
    (with back-off) within that time, from the last entry read. A refused password raises at once."""
    keys = keys or Keys()
    key, last = keys.out(job_id), b"0"
    deadline = time.monotonic() + timeout_s
    reader = bounded_reader(client, timeout_s)
    block_ms = read_block_ms(reader, block_ms)
    backoff, lost = Backoff(), None
    try:
        while True:
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                why = f"Redis unreachable ({lost})" if lost is not None else "is a worker serving this queue?"
                raise NoAnswer(f"no terminal event for {job_id} within {timeout_s:g}s: {why}")
            try:
                # Any: redis-py types replies for both decode modes (worker.connection's are bytes).
                reply: Any = reader.xread({key: last}, block=max(1, min(block_ms, left_ms)), count=1000)
            except redis.AuthenticationError:
                raise
            except (redis.ConnectionError, redis.TimeoutError) as exc:  # not one class in redis-py 8
                lost = exc
                time.sleep(min(backoff.next_delay(), max(0.0, deadline - time.monotonic())))
                continue
            backoff.reset()
            lost = None
            for entry_id, fields in reply[0][1] if reply else []:
                last = entry_id
                event = json.loads(fields[EVENT_FIELD])
                yield event
                if event["type"] in ("done", "error"):
                    return
    finally:
        if reader is not client:
            reader.close()


def collect(client: redis.Redis, job_id: str, keys: Keys | None = None, timeout_s: float = 300) -> list[dict]:
    return list(events(client, job_id, keys, timeout_s=timeout_s))
