"""Priority lanes and tenant lanes: which request stream a job waits in, the rule workers and clients share.

A worker started with `--priority-lanes 0,10` or `--tenant-weight NAME=W` reads several streams beside
its requests stream (intake/lanes.py) and writes the layout, this JSON, to `Keys.lane_layout`
(`<requests>:lanes`) at start. A client reads that key (absent: no lanes, the requests stream as
always) and adds each job to the stream `stream_for(job)` names:

    by priority, levels [0, 10]:   priority < 10  -> conveyor:requests        (the level of priority 0)
                                   priority >= 10 -> conveyor:requests:p10
    by tenant, tenants [a, b]:     tenant a       -> conveyor:requests:t:a
                                   tenant b       -> conveyor:requests:t:b
                                   tenant c       -> conveyor:requests:t:c    ("open": every tenant)
                                   none, default  -> conveyor:requests       (the default lane)

Tenant layouts are open (`"open": true`): a tenant not named at the workers' start gets a lane of its
own too, `<requests>:t:<tenant>`, and the client that adds its job also adds the tenant to the set
`<requests>:tenants` (SADD, before the XADD). Workers read that set every registry interval and add a
lane for each tenant new to them (weight 1 unless `--tenant-weight` names it), so a tenant first seen at
run time gets its own share without a restart. A layout without `open` (older workers) sends tenants
not named to the default lane, as an older client does with any layout.

A job's level is the largest level not above its priority (below the first level: the first). The lane
that a job with no priority or no tenant goes to is the requests stream itself, so a client that knows
nothing of lanes still gets its jobs served (at the default priority, in the default tenant's share).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from worker.intake.fair_share import FairShare
from worker.intake.lanes import Lane
from worker.intake.priority_lanes import PriorityLanes
from worker.intake.read_policy import ReadPolicy
from worker.keys import Keys
from worker.protocol import TENANT_PATTERN
from worker.shard_choice import choose_lane

_TENANT = re.compile(TENANT_PATTERN)
DEFAULT_TENANT = "default"  # the default lane's name in --tenant-weight (the gateway's tenant of a bare key)


class LaneLayout(BaseModel):
    """The layout JSON at `<requests>:lanes`; readers ignore fields they do not know."""

    model_config = ConfigDict(extra="ignore")

    v: Literal[1] = 1
    by: Literal["priority", "tenant"]
    levels: list[int] = Field(default_factory=list)  # by priority: ascending, lane k reads level k
    tenants: list[str] = Field(default_factory=list)  # by tenant: lane 0 is the default, lane k+1 tenants[k]
    streams: list[str]  # lane k's request stream
    open: bool = False  # by tenant: a tenant not named gets a lane of its own (see the module docstring)

    @model_validator(mode="after")
    def _one_stream_per_lane(self) -> LaneLayout:
        names = self.levels if self.by == "priority" else [DEFAULT_TENANT, *self.tenants]
        if len(names) != len(self.streams) or len(set(self.streams)) != len(self.streams):
            raise ValueError(f"a lane layout needs one distinct stream per lane: {names} {self.streams}")
        return self

    def lane_of(self, job: Mapping[str, Any]) -> int:
        """The lane (index into `streams`) a job, as the dict put on the wire, is added to (the rule is
        worker/shard_choice.py's `choose_lane`)."""
        return choose_lane(job, self)

    def stream_for(self, job: Mapping[str, Any]) -> str:
        tenant = self.unnamed_tenant(job)
        if tenant is not None:
            return tenant_stream(self.streams[0], tenant)
        return self.streams[self.lane_of(job)]

    def unnamed_tenant(self, job: Mapping[str, Any]) -> str | None:
        """The job's tenant when an open tenant layout gives it a lane not in `streams`: the client adds
        it to `tenants_key` with the job. A tenant the workers would refuse (not TENANT_PATTERN) goes to
        the default lane, where its job is answered with the error."""
        tenant = job.get("tenant")
        if self.by != "tenant" or not self.open or not isinstance(tenant, str):
            return None
        if tenant == DEFAULT_TENANT or tenant in self.tenants or not _TENANT.match(tenant):
            return None
        return tenant

    @property
    def tenants_key(self) -> str:
        """The set of tenants clients have added jobs for (an open tenant layout): `<requests>:tenants`."""
        return f"{self.streams[0]}:tenants"

    def lanes(self, keys: Keys, group: str) -> list[Lane]:
        """The worker's lanes: each a stream of its own, the jobs' keys shared (a job id is one job in
        whichever lane it waits)."""
        return [Lane(replace(keys, requests_stream=stream), group) for stream in self.streams]


def priority_layout(keys: Keys, levels: list[int]) -> LaneLayout:
    """A lane per level; the level holding priority 0 reads the requests stream itself."""
    levels = sorted(set(levels))
    if len(levels) < 2:
        raise ValueError("priority lanes need at least two distinct levels, e.g. 0,10")
    streams = [keys.lane(f"p{level}") for level in levels]
    layout = LaneLayout(by="priority", levels=levels, streams=streams)
    streams[layout.lane_of({})] = keys.requests  # the lane of the default priority, 0
    return LaneLayout(by="priority", levels=levels, streams=streams)


def tenant_layout(keys: Keys, tenants: list[str]) -> LaneLayout:
    """The default lane (the requests stream: no tenant) and one per named tenant; open, so every other
    tenant gets one too once a client has added its first job."""
    named = [t for t in dict.fromkeys(tenants) if t != DEFAULT_TENANT]
    if not named:
        raise ValueError("tenant lanes need at least one tenant besides 'default'")
    streams = [keys.requests, *(tenant_stream(keys.requests, tenant) for tenant in named)]
    return LaneLayout(by="tenant", tenants=named, streams=streams, open=True)


def tenant_stream(requests: str, tenant: str) -> str:
    """A tenant's lane beside the requests stream (the default lane)."""
    return f"{requests}:t:{tenant}"


def register_tenant(client: Any, layout: LaneLayout | None, job: Mapping[str, Any]) -> None:
    """Before a client adds `job` to `layout.stream_for(job)`: a tenant with a lane not in the layout
    is added to the set the workers read, so they add its lane (SADD: once or many times, the same)."""
    tenant = layout.unnamed_tenant(job) if layout is not None else None
    if tenant is not None:
        assert layout is not None
        client.sadd(layout.tenants_key, tenant)


def parse_levels(text: str) -> list[int]:
    """`--priority-lanes`: comma-separated integer levels, e.g. "0,10"."""
    try:
        levels = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"priority levels must be integers separated by commas, not {text!r}") from None
    if len(set(levels)) < 2:
        raise ValueError(f"priority lanes need at least two distinct levels, e.g. 0,10 (got {text!r})")
    return sorted(set(levels))


def parse_weights(items: list[str] | tuple[str, ...]) -> dict[str, float]:
    """`--tenant-weight NAME=W` (repeatable; a bare NAME is weight 1). 'default' weighs the default lane."""
    weights: dict[str, float] = {}
    for item in items:
        name, _, value = item.partition("=")
        if not re.fullmatch(TENANT_PATTERN, name):
            raise ValueError(f"tenant {name!r} in {item!r} is not 1-64 characters of [A-Za-z0-9._-]")
        try:
            weight = float(value) if value else 1.0
        except ValueError:
            raise ValueError(f"weight {value!r} in {item!r} is not a number") from None
        if not weight > 0:
            raise ValueError(f"weight in {item!r} must be > 0")
        weights[name] = weight
    return weights


def lane_weights(layout: LaneLayout, weights: Mapping[str, float]) -> list[float]:
    """Per lane of a tenant layout, its weight (default 1)."""
    return [weights.get(name, 1.0) for name in [DEFAULT_TENANT, *layout.tenants]]


def read_layout(client: Any, keys: Keys) -> LaneLayout | None:
    """The layout the workers wrote (None: no lanes, jobs go to the requests stream)."""
    raw = client.get(keys.lane_layout)
    return None if raw is None else LaneLayout.model_validate_json(raw)


async def read_layout_async(client: Any, keys: Keys) -> LaneLayout | None:
    """`read_layout` on a redis.asyncio client (the HTTP gateway): route a job with `stream_for(job)`."""
    raw = await client.get(keys.lane_layout)
    return None if raw is None else LaneLayout.model_validate_json(raw)


def write_layout(client: Any, keys: Keys, layout: LaneLayout) -> None:
    """At the start of a worker with lanes: every worker with the same options writes the same bytes."""
    client.set(keys.lane_layout, layout.model_dump_json())


def read_policy(layout: LaneLayout, weights: Mapping[str, float]) -> ReadPolicy:
    """Priority lanes read the smallest level first (PriorityLanes); tenant lanes share by weight in
    tokens served (FairShare)."""
    if layout.by == "priority":
        return PriorityLanes(len(layout.streams))
    return FairShare(lane_weights(layout, weights))
