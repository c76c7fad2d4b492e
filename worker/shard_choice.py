"""Which shard of protocol version 2's queue a job goes to: the one rule every submitting client follows
(worker/client.py on one Redis, worker/cluster/client.py on a cluster, the CLI, the batch runner).

Today: crc32 of the job id modulo the shard count, so submitting the same id again lands on the same
shard, where the worker's owner key keeps it from running twice (docs/protocol.md, "Version 2").
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any


def choose_shard(job: Mapping[str, Any], shards: int) -> int:
    """The shard (0..shards-1) whose request stream `job` (the wire dict, with its "id") is added to."""
    if shards < 1:
        raise ValueError("shards must be >= 1")
    return zlib.crc32(str(job["id"]).encode()) % shards
