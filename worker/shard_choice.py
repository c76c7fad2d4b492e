"""Which shard of protocol version 2's queue a job goes to: the one rule every submitting client follows
(worker/client.py on one Redis, worker/cluster/client.py on a cluster, the CLI, the batch runner).

A job with an `affinity` key goes to crc32(key) modulo the shard count, so the jobs sharing a prompt
prefix share a shard, read first by that shard's home worker (docs/protocol.md, "Affinity"; the submitting
clients set the default key before choosing, worker/affinity_key.py). A job without one goes to crc32 of
its id. Either way submitting the same job again lands on the same shard, where the worker's owner key
keeps it from running twice (docs/protocol.md, "Version 2").
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any


def choose_shard(job: Mapping[str, Any], shards: int) -> int:
    """The shard (0..shards-1) whose request stream `job` (the wire dict, with its "id") is added to."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    key = job.get("affinity")
    routed_by = key if isinstance(key, str) and key else str(job["id"])
    return zlib.crc32(routed_by.encode()) % shards
