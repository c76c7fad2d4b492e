"""Which shard of protocol version 2's queue, or which priority or tenant lane, a job goes to: the rules
every submitting client follows (worker/client.py on one Redis, worker/cluster/client.py on a cluster,
the CLI, the batch runner).

A job with an `affinity` key goes to crc32(key) modulo the shard count, so the jobs sharing a prompt
prefix share a shard, read first by that shard's home worker (docs/protocol.md, "Affinity"; the submitting
clients set the default key before choosing, worker/affinity_key.py). A job without one goes to crc32 of
its id. Either way submitting the same job again lands on the same shard, where the worker's owner key
keeps it from running twice (docs/protocol.md, "Version 2").
Lanes: by the job's priority or tenant, as the workers' lane layout says (intake/lane_layout.py;
docs/protocol.md, "Priority and tenant lanes"). Workers refuse shards and lanes together, so a job has a
shard or a lane, never both.
"""

from __future__ import annotations

import bisect
import zlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from worker.intake.lane_layout import LaneLayout


def choose_shard(job: Mapping[str, Any], shards: int) -> int:
    """The shard (0..shards-1) whose request stream `job` (the wire dict, with its "id") is added to."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    key = job.get("affinity")
    routed_by = key if isinstance(key, str) and key else str(job["id"])
    return zlib.crc32(routed_by.encode()) % shards


def choose_lane(job: Mapping[str, Any], layout: LaneLayout) -> int:
    """The lane (index into `layout.streams`) `job` is added to. By priority: the largest level not above
    the job's priority (a missing priority is 0; below the first level: lane 0). By tenant: the named
    tenant's lane; no tenant, or one not named: lane 0, the default lane."""
    if layout.by == "priority":
        return max(0, bisect.bisect_right(layout.levels, int(job.get("priority") or 0)) - 1)
    tenant = job.get("tenant")
    return layout.tenants.index(tenant) + 1 if tenant in layout.tenants else 0
