"""The stream hub's interface (worker/gateway/stream_hub.py) where each request reads its own output
stream, with job_io.follow: in a Redis Cluster, where one XREAD cannot name streams in different slots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import structlog

from worker.gateway import job_io
from worker.gateway.stream_hub import Sink
from worker.keys import Keys

log = structlog.get_logger("conveyor.gateway")


class OwnReads:
    def __init__(self, client, block_ms: int) -> None:
        self.client, self.block_ms = client, block_ms
        # (output stream, sink) -> the task handing its events out: one per request, several for a stream
        # whose X-Request-Id was sent again while its first request is answered.
        self._readers: dict[tuple[str, Sink], asyncio.Task] = {}
        self._following: dict[str, int] = {}  # output stream -> requests reading it through `follow`

    async def follow(self, keys: Keys, job_id: str, deadline: float) -> AsyncIterator[list[dict]]:
        key = keys.out(job_id)
        self._following[key] = self._following.get(key, 0) + 1
        try:
            async for batch in job_io.follow(self.client, keys, job_id, self.block_ms, deadline):
                yield batch
        finally:
            self._following[key] -= 1
            if not self._following[key]:
                del self._following[key]

    async def attach(self, keys: Keys, job_id: str, sink: Sink) -> None:
        """`sink(events)` with each batch of the job's events, from a task of the request's own; until
        the terminal event's batch, or `detach`."""
        self._readers[keys.out(job_id), sink] = asyncio.ensure_future(self._read(keys, job_id, sink))

    def detach(self, keys: Keys, job_id: str, sink: Sink) -> None:
        reader = self._readers.pop((keys.out(job_id), sink), None)
        if reader is not None:
            reader.cancel()

    def followed(self, keys: Keys, job_id: str) -> bool:
        key = keys.out(job_id)
        return key in self._following or any(stream == key for stream, _ in self._readers)

    def close(self) -> None:
        for reader in self._readers.values():
            reader.cancel()
        self._readers.clear()

    async def _read(self, keys: Keys, job_id: str, sink: Sink) -> None:
        try:
            async for batch in job_io.follow(self.client, keys, job_id, self.block_ms, None):
                sink(batch)
        except Exception:  # as the hub: the answer's own deadline ends it
            log.exception("a stream's events could not be handed out", request_id=job_id)
        finally:
            if self._readers.get((keys.out(job_id), sink)) is asyncio.current_task():
                del self._readers[keys.out(job_id), sink]
