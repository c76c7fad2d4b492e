"""Tenants first seen at run time get a lane of their own, without a worker restart.

An open tenant layout (intake/lane_layout.py) sends a tenant not named by `--tenant-weight` to
`<requests>:t:<tenant>`, and its client adds the tenant to the set `<requests>:tenants`. Every registry
interval, on the loop's thread (`Worker.between_ticks`), this reads the set and adds a lane for each
tenant new to the worker: a FairShare lane of weight 1 (or the weight `--tenant-weight` gives it), read
through the worker's group from the stream's first entry, and listed in its registry record.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import replace

import redis
import structlog

from worker.config import WorkerConfig
from worker.fleet.heartbeat import Heartbeat
from worker.intake.fair_share import FairShare
from worker.intake.lane_layout import DEFAULT_TENANT, LaneLayout, tenant_stream
from worker.intake.lanes import Lane
from worker.protocol import TENANT_PATTERN
from worker.run.loop import Worker

log = structlog.get_logger("conveyor.worker")
_TENANT = re.compile(TENANT_PATTERN)


class TenantWatch:
    def __init__(
        self,
        worker: Worker,
        client: redis.Redis,
        cfg: WorkerConfig,
        layout: LaneLayout,
        weights: Mapping[str, float],
        heartbeat: Callable[[], Heartbeat | None],
    ) -> None:
        self.worker, self.client, self.cfg = worker, client, cfg
        self.layout, self.weights, self.heartbeat = layout, weights, heartbeat
        self.known = {DEFAULT_TENANT, *layout.tenants}
        self._read_at = -1e9  # the first cycle reads the set: tenants seen before this worker started

    def __call__(self) -> None:
        now = time.monotonic()
        if now - self._read_at < self.cfg.registry_interval_s or self.worker.stop.warm.is_set():
            return  # (a draining worker takes no new work, so no new lanes)
        self._read_at = now
        try:
            found = self.client.smembers(self.layout.tenants_key)
        except redis.RedisError as exc:  # Redis away or full: the loop copes; the next interval retries
            log.warning("could not read the tenants set", key=self.layout.tenants_key, error=str(exc))
            return
        new = sorted({_text(t) for t in found} - self.known)
        for tenant in new:
            self.known.add(tenant)
            if _TENANT.match(tenant):  # a client that wrote anything else wrote no job there either
                self._add(tenant)
        if new:
            beat = self.heartbeat()
            if beat is not None:
                beat.set_streams([lane.stream for lane in self.worker.lanes])

    def _add(self, tenant: str) -> None:
        policy = self.worker.policy
        assert isinstance(policy, FairShare)  # an open layout is a tenant layout
        weight = self.weights.get(tenant, 1.0)
        policy.add_lane(weight)
        keys = replace(self.cfg.keys, requests_stream=tenant_stream(self.layout.streams[0], tenant))
        self.worker.add_lane(Lane(keys, self.cfg.group), self.client)
        log.info("tenant lane added", tenant=tenant, stream=keys.requests, weight=weight)


def _text(value: bytes | str) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else value
