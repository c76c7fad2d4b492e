"""What `conveyor top`, the dashboard and the autoscaling gauges show: one typed snapshot of the fleet.

Read from Redis by worker/fleet/read_fleet.py; everything here is derived from what it read, no I/O.
Where each number comes from:

    backlog, pending      XINFO GROUPS of each request stream: the group's `lag` (entries not yet
                          delivered) and `pending` (delivered, not acknowledged), summed over streams
    oldest_wait_s         server time minus the time part of the oldest undelivered entry's id
    jobs/tokens per s     the live workers' registry records (worker/fleet/registry.py)
    backlog_tokens        backlog x the model's mean tokens per job (prompt + completion, usage counters)
    drain_s               backlog_tokens / the model's tokens per second (in + out); without a token
                          estimate backlog / jobs per second; DRAIN_CAP_S when nothing is being served
    dead_last_hour        dead-letter entries whose id is under an hour old, by their `group` field
    ttft p50/p99          nearest-rank quantiles of the TTFTs the live records carry (ttft_ms_recent)
"""

from __future__ import annotations

import math

from pydantic import BaseModel, Field

from worker.fleet.accounting import TenantUsage

DRAIN_CAP_S = 86_400.0  # drain time reported for a backlog nobody is serving: scale up
HOUR_MS = 3_600_000


class ModelView(BaseModel):
    model: str  # the served model name (the records' `model`; the group's name when no worker is live)
    group: str
    streams: list[str]
    backlog: int = 0
    pending: int = 0
    oldest_wait_s: float | None = None  # None: nothing waiting
    workers: int = 0  # live
    jobs_per_s: float = 0.0
    tokens_in_per_s: float = 0.0
    tokens_out_per_s: float = 0.0
    tokens_per_job: float | None = None  # mean prompt + completion tokens of its finished jobs
    backlog_tokens: int | None = None
    drain_s: float = 0.0
    dead_last_hour: int = 0


class StreamView(BaseModel):
    """A request stream with jobs waiting in it, whether or not any worker reads it."""

    stream: str
    backlog: int  # entries no group has read (every entry when the stream has no group)
    readers: int = 0  # live, not draining workers that read it

    @property
    def unread(self) -> bool:
        """Jobs wait and no live worker will take them: a wrong --model/--stream, or every worker gone."""
        return self.backlog > 0 and self.readers == 0


class WorkerView(BaseModel):
    consumer: str
    model: str | None  # None: lost (its record lapsed)
    host: str | None = None
    lost: bool
    draining: bool = False
    running: int = 0
    waiting: int = 0
    kv_blocks_used: int = 0
    kv_blocks_total: int = 0
    tokens_per_s: float = 0.0  # output tokens
    heartbeat_age_s: float  # server time minus its last heartbeat

    @property
    def kv_use(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class BatchView(BaseModel):
    """A batch in progress, as its driver last wrote it (worker/fleet/read_fleet.py, `batches`)."""

    id: str
    total: int
    done: int = 0
    failed: int = 0
    model: str | None = None
    updated_ms: int = 0  # when its driver last wrote it (the driver's clock)


class FleetSnapshot(BaseModel):
    v: int = 1
    taken_ms: int  # Redis server time
    models: list[ModelView]
    workers: list[WorkerView]
    tenants: list[TenantUsage]
    batches: list[BatchView]
    streams: list[StreamView] = Field(default_factory=list)  # request streams with a backlog
    dead_last_hour: int  # all dead letters, those of no known model included
    ttft_p50_s: float | None = None
    ttft_p99_s: float | None = None

    @property
    def tokens_per_s(self) -> float:
        return sum(m.tokens_out_per_s for m in self.models)


def quantile(values: list[int], q: float) -> float | None:
    """Nearest-rank quantile (no interpolation: a value some job really saw)."""
    if not values:
        return None
    ordered = sorted(values)
    return float(ordered[max(0, math.ceil(q * len(ordered)) - 1)])


def drain_seconds(m: ModelView) -> float:
    if m.backlog == 0:
        return 0.0
    rate_tokens = m.tokens_in_per_s + m.tokens_out_per_s
    if m.backlog_tokens is not None and rate_tokens > 0:
        return min(DRAIN_CAP_S, m.backlog_tokens / rate_tokens)
    if m.jobs_per_s > 0:
        return min(DRAIN_CAP_S, m.backlog / m.jobs_per_s)
    return DRAIN_CAP_S
