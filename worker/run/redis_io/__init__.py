"""The worker's only code below redis-py's public API (tests/worker/run/test_redis_io_boundary.py keeps it
so): rounds written and read on a pooled connection (wire.py), the cluster shard's pool that follows its
slot's master (slot_following.py), and the gateway's asyncio connections packing with hiredis
(async_packing.py). Everything else talks to Redis through redis-py's public API."""

from worker.run.redis_io.slot_following import REDIRECTS, MasterPool, ShardMoved
from worker.run.redis_io.wire import (
    cut_off,
    exchange,
    exchange_public,
    execute,
    execute_plain,
    no_resends,
)

__all__ = [
    "REDIRECTS",
    "MasterPool",
    "ShardMoved",
    "cut_off",
    "exchange",
    "exchange_public",
    "execute",
    "execute_plain",
    "no_resends",
]
