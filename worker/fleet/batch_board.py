"""A batch driver's progress in Redis, for `conveyor top` and the dashboard: one field of the hash
`Keys.batches` (`<prefix>:batches`, or shard 0's in a cluster) per batch in progress, a BatchView as JSON,
written at most once a second and removed when the batch ends. A driver that dies leaves its field
behind: readers skip fields not updated for STALE_MS."""

from __future__ import annotations

import os
import socket
import time

import structlog

from worker.fleet.snapshot import BatchView

log = structlog.get_logger("conveyor.batch")
STALE_MS = 60_000
EVERY_S = 1.0


class BatchBoard:
    def __init__(self, client, key: str, name: str, total: int, model: str | None = None) -> None:
        self.client, self.key = client, key
        # Unique among live drivers; says where the batch runs.
        self.view = BatchView(id=f"{socket.gethostname()}:{os.getpid()}:{name}", total=total, model=model)
        self._written = 0.0

    def update(self, done: int, failed: int, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._written < EVERY_S:
            return
        self._written = now
        self.view = self.view.model_copy(update={"done": done, "failed": failed, "updated_ms": _ms()})
        try:
            self.client.hset(self.key, self.view.id, self.view.model_dump_json())
        except Exception as exc:  # progress is for people: the batch goes on without it
            log.warning("could not write batch progress", error=str(exc))

    def close(self) -> None:
        try:
            self.client.hdel(self.key, self.view.id)
        except Exception as exc:
            log.warning("could not remove batch progress", error=str(exc))


def _ms() -> int:
    return int(time.time() * 1000)
