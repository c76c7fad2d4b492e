"""The stream hub's interface (worker/gateway/stream_hub.py) where each request reads its own output
stream, with job_io.follow: in a Redis Cluster, where one XREAD cannot name streams in different slots."""

from __future__ import annotations

from collections.abc import AsyncGenerator

from worker.gateway import job_io
from worker.keys import Keys
from worker.protocol import Event


class OwnReads:
    def __init__(self, client, block_ms: int) -> None:
        self.client, self.block_ms = client, block_ms
        self._following: dict[str, int] = {}  # output stream -> requests reading it

    async def follow(self, keys: Keys, job_id: str, deadline: float) -> AsyncGenerator[list[Event], None]:
        key = keys.out(job_id)
        self._following[key] = self._following.get(key, 0) + 1
        try:
            async for batch in job_io.follow(self.client, keys, job_id, self.block_ms, deadline):
                yield batch
        finally:
            self._following[key] -= 1
            if not self._following[key]:
                del self._following[key]

    def followed(self, keys: Keys, job_id: str) -> bool:
        return keys.out(job_id) in self._following
