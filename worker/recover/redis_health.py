"""Whether Redis has room: under `maxmemory-policy noeviction` a full Redis refuses writes with OOM.

The worker then keeps its in-flight jobs, admits nothing new (its round, reads included, is refused whole)
and retries with back-off; this object says so once in the log and in the metrics, and again when Redis
takes writes again.
"""

from __future__ import annotations

from collections.abc import Callable

import structlog

log = structlog.get_logger("conveyor.redis")


class RedisHealth:
    def __init__(self, on_full: Callable[[bool], None] | None = None) -> None:
        self.is_full = False
        self.on_full = on_full or (lambda full: None)  # metrics: the conveyor_redis_full gauge

    def full(self, what: str, error: Exception, retry_in_s: float) -> None:
        if not self.is_full:
            log.error(
                "redis is full: writes refused, holding in-flight jobs and admitting none until it has room",
                during=what,
                error=str(error),
                retry_in_s=retry_in_s,
            )
        self.is_full = True
        self.on_full(True)

    def ok(self) -> None:
        if self.is_full:
            log.info("redis has room again: resuming")
            self.is_full = False
            self.on_full(False)
