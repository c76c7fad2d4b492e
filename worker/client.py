"""A small client: enqueue a job, then read its events from the output stream (replay, then follow).

Used by `conveyor submit`, the demo, the benchmark and the tests. Reading the stream from `0` means a
client that starts reading late still sees every event, and one that lost its connection (a Redis
restart) goes on from the last entry id it has seen.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import redis

from worker.connection import Backoff
from worker.keys import EVENT_FIELD, JOB_FIELD, Keys

_DEFAULT_BLOCK_MS = 5000
_UNSET = object()


def enqueue(client: redis.Redis, job: dict, keys: Keys | None = None) -> bytes:
    keys = keys or Keys()
    entry_id: bytes = client.xadd(keys.requests, {JOB_FIELD: json.dumps(job)})  # type: ignore[assignment]
    return entry_id


def read_block_ms(client: redis.Redis, wanted_ms: int = _DEFAULT_BLOCK_MS) -> int:
    """XREAD BLOCK must return before the client's socket timeout (redis-py 8 defaults it to 5 s), or the
    read fails with TimeoutError on a quiet stream: block for at most half of it."""
    pool = client.connection_pool
    # The connection's own default applies when the URL or kwargs do not set one (from_url leaves it out).
    timeout_s = pool.connection_kwargs.get("socket_timeout", _UNSET)
    if timeout_s is _UNSET:
        timeout_s = getattr(pool.connection_class(**pool.connection_kwargs), "socket_timeout", None)
    if timeout_s is None:
        return wanted_ms
    return max(1, min(wanted_ms, int(timeout_s * 1000 / 2)))


def events(
    client: redis.Redis,
    job_id: str,
    keys: Keys | None = None,
    block_ms: int = _DEFAULT_BLOCK_MS,
    timeout_s: float = 300,
) -> Iterator[dict]:
    """Yield the job's events in order, ending after the terminal one. Raises TimeoutError when no terminal
    event came within timeout_s; a lost connection is retried (with back-off) within that time."""
    keys = keys or Keys()
    key, last = keys.out(job_id), b"0"
    deadline = time.monotonic() + timeout_s
    block_ms = read_block_ms(client, block_ms)
    backoff = Backoff()
    while True:
        try:
            # Any: redis-py types replies for both decode modes; this client's are bytes (worker.connection).
            reply: Any = client.xread({key: last}, block=block_ms, count=1000)
        except redis.ConnectionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(backoff.next_delay())
            continue
        backoff.reset()
        if not reply:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no terminal event for {job_id} within {timeout_s}s")
            continue
        for entry_id, fields in reply[0][1]:
            last = entry_id
            event = json.loads(fields[EVENT_FIELD])
            yield event
            if event["type"] in ("done", "error"):
                return


def collect(client: redis.Redis, job_id: str, keys: Keys | None = None, timeout_s: float = 300) -> list[dict]:
    return list(events(client, job_id, keys, timeout_s=timeout_s))
