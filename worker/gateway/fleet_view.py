"""Which models have a live worker, and the request stream each one's jobs go to, from the worker registry
(worker/fleet/registry.py). Read at most every CACHE_S per gateway process: a request does not pay for a
registry read, and a worker that died shows within its record's TTL plus CACHE_S; a model missing from
the cached read is looked up again at once, so a worker that just registered is found."""

from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

from worker.fleet.registry import WorkerRecord, live, read_async
from worker.keys import Keys

CACHE_S = 0.5


@dataclass(frozen=True)
class ServedModel:
    name: str
    workers: list[WorkerRecord]

    @property
    def max_model_len(self) -> int:
        return min(w.max_model_len for w in self.workers)

    @property
    def streams(self) -> list[str]:
        """The lanes its live workers read, most read first (every worker of a model reads the same ones,
        unless an operator gave some of them --stream)."""
        counts: dict[str, int] = {}
        for w in self.workers:
            for s in w.streams:
                counts[s] = counts.get(s, 0) + 1
        return sorted(counts, key=lambda s: (-counts[s], s))

    def stream_for(self, job_id: str) -> str:
        """The lane a job is submitted to: the one its workers read, or among several (lanes), by its id."""
        streams = self.streams
        return streams[0] if len(streams) == 1 else streams[zlib.crc32(job_id.encode()) % len(streams)]

    @property
    def groups(self) -> list[str]:
        return sorted({w.group for w in self.workers})


class FleetView:
    def __init__(self, client, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._read_at = -1e9
        self._models: dict[str, ServedModel] = {}

    async def models(self, fresh: bool = False) -> dict[str, ServedModel]:
        """Live, not draining workers by the model they serve; `fresh`: read the registry now (a model the
        cached read does not know may have a worker that registered since)."""
        if fresh or time.monotonic() - self._read_at > CACHE_S:
            records = [w for w in live(await read_async(self.client, self.keys)) if not w.draining]
            by_model: dict[str, list[WorkerRecord]] = {}
            for w in records:
                by_model.setdefault(w.model, []).append(w)
            self._models = {name: ServedModel(name, ws) for name, ws in sorted(by_model.items())}
            self._read_at = time.monotonic()
        return self._models
