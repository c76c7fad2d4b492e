"""Which models have a live worker, and the request stream each one's jobs go to, from the worker registry
(worker/fleet/registry.py). Read at most every CACHE_S per gateway process: a request does not pay for a
registry read, and a worker that died shows within its record's TTL plus CACHE_S; a model missing from
the cached read is looked up again at once, so a worker that just registered is found."""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.cluster.shard_keys import ShardedKeys
from worker.fleet.registry import WorkerRecord, live, read_async
from worker.intake.lane_layout import LaneLayout
from worker.keys import Keys
from worker.shard_choice import choose_shard

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

    def layout_keys(self, prefix: str) -> Keys | None:
        """Where the workers' priority or tenant lane layout is kept, when they read split streams (the
        default lane's stream, of which every other lane's name is an extension); None otherwise."""
        streams = self.streams
        base = min(streams, key=len)
        if len(streams) > 1 and all(s == base or s.startswith(base + ":") for s in streams):
            return Keys(prefix=prefix, requests_stream=base)
        return None

    def stream_for(self, job: Mapping[str, Any], prefix: str, layout: LaneLayout | None) -> str:
        """The stream a job is added to, by the rules every client follows (worker/shard_choice.py): its
        lane by the workers' `layout`, or its shard of protocol version 2 (by its affinity key, else its
        id); one stream: that one. Streams in no layout the gateway knows: spread by the job's id."""
        streams = self.streams
        if len(streams) == 1:
            return streams[0]
        if layout is not None and set(layout.streams) <= set(streams):
            return layout.stream_for(job)
        sharded = ShardedKeys(prefix, len(streams))
        by_shard = [keys.requests for keys in sharded.all()]
        if set(by_shard) == set(streams):
            return by_shard[choose_shard(job, len(streams))]
        return streams[zlib.crc32(str(job["id"]).encode()) % len(streams)]

    @property
    def groups(self) -> list[str]:
        return sorted({w.group for w in self.workers})


class FleetView:
    def __init__(self, client, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._read_at = -1e9  # when the last read began
        self._models: dict[str, ServedModel] = {}
        # One read at a time: the requests that find the cache stale together (64 arriving at once)
        # share one read instead of each making its own.
        self._reading = asyncio.Lock()

    async def models(self, fresh: bool = False) -> dict[str, ServedModel]:
        """Live, not draining workers by the model they serve; `fresh`: read the registry now (a model the
        cached read does not know may have a worker that registered since), or take a read that began
        after this call did."""
        asked = time.monotonic()
        async with self._reading:
            if (fresh and self._read_at < asked) or asked - self._read_at > CACHE_S:
                await self._read()
        return self._models

    async def _read(self) -> None:
        began = time.monotonic()
        records = [w for w in live(await read_async(self.client, self.keys)) if not w.draining]
        by_model: dict[str, list[WorkerRecord]] = {}
        for w in records:
            by_model.setdefault(w.model, []).append(w)
        self._models = {name: ServedModel(name, ws) for name, ws in sorted(by_model.items())}
        self._read_at = began
