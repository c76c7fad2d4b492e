"""A small client: enqueue a job, then read its events from the output stream (replay, then follow).

Used by `conveyor submit`, the demo, the benchmark and the tests. Reading the stream from `0` means a
client that starts reading late still sees every event.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import redis

from worker.keys import EVENT_FIELD, JOB_FIELD, Keys


def enqueue(client: redis.Redis, job: dict, keys: Keys | None = None) -> bytes:
    keys = keys or Keys()
    return client.xadd(keys.requests, {JOB_FIELD: json.dumps(job)})


def events(
    client: redis.Redis, job_id: str, keys: Keys | None = None, block_ms: int = 1000, timeout_s: float = 300
) -> Iterator[dict]:
    """Yield the job's events in order, ending after the terminal one. Raises TimeoutError when idle too long."""
    # block_ms stays under redis-py 8's default 5 s socket timeout, else an idle wait raises redis's TimeoutError.
    import time

    keys = keys or Keys()
    key, last = keys.out(job_id), b"0"
    deadline = time.monotonic() + timeout_s
    while True:
        reply = client.xread({key: last}, block=block_ms, count=1000)
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
