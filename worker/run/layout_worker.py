"""A worker over priority or tenant lanes (intake/lane_layout.py): a LanesWorker (run/lanes_worker.py)
whose lanes are the layout's streams, all on one Redis, read with the layout's policy (PriorityLanes or
FairShare). It writes the layout for clients before it reads; an open tenant layout's worker adds a lane
for each tenant clients add jobs for (run/tenant_watch.py).
"""

from __future__ import annotations

from collections.abc import Mapping

import redis

from engine.client import EngineClient
from worker.config import WorkerConfig
from worker.connection import with_retry
from worker.intake.lane_layout import LaneLayout, read_policy, write_layout
from worker.run.hooks import NO_HOOKS, Hooks
from worker.run.lanes_worker import LanesWorker
from worker.run.observer import Observer


def layout_worker(
    engine: EngineClient,
    client: redis.Redis,
    cfg: WorkerConfig,
    layout: LaneLayout,
    weights: Mapping[str, float] | None = None,
    observer: Observer | None = None,
    hooks: Hooks = NO_HOOKS,
) -> LanesWorker:
    """`weights`: tenant -> weight (tenant lanes; 'default' weighs the default lane; absent: 1)."""
    lanes = layout.lanes(cfg.keys, cfg.group)
    worker = LanesWorker(
        engine, lanes, [client] * len(lanes), cfg, read_policy(layout, weights or {}), observer, hooks=hooks
    )
    if layout.open:  # tenants first seen at run time get lanes of their own (run/tenant_watch.py)
        from worker.run.tenant_watch import TenantWatch

        watch = TenantWatch(worker, client, cfg, layout, weights or {}, lambda: worker.observer.heartbeat)
        worker.between_ticks.append(watch)
    # Waited out like every start-up write: a full (or restarting) Redis holds the start, never ends it.
    with_retry(lambda: write_layout(client, cfg.keys, layout), "writing the lane layout", worker.stop)
    return worker
