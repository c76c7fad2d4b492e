"""One gateway replica drives a batch at a time: it holds `<prefix>:batch:{<id>}:lease` (its token, PX ttl).

It renews the lease every ttl/3 while it drives; a replica that dies stops renewing, the key expires, and
another replica's driver pool (driver_pool.py) takes it. Every write the driver makes checks the token in
the same Lua call (redis_sink.py, batch_store.py), so a replica that lost its lease while paused writes
nothing more.
"""

from __future__ import annotations

import time
import uuid

import redis

_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class Handover(Exception):
    """This replica is stopping: it stops driving the batch and releases the lease for another one."""


class BatchLease:
    def __init__(self, client: redis.Redis, key: str, ttl_ms: int, holder: str) -> None:
        self.client, self.key, self.ttl_ms = client, key, ttl_ms
        self.token = f"{holder}:{uuid.uuid4().hex[:12]}"
        self._renew, self._release = client.register_script(_RENEW), client.register_script(_RELEASE)
        self._renewed = 0.0

    def acquire(self) -> bool:
        got = bool(self.client.set(self.key, self.token, nx=True, px=self.ttl_ms))
        if got:
            self._renewed = time.monotonic()
        return got

    def keep(self) -> bool:
        """Renew when a third of the ttl has passed since the last renewal; False once the lease is lost."""
        now = time.monotonic()
        if now - self._renewed < self.ttl_ms / 3000:
            return True
        if not self._renew(keys=[self.key], args=[self.token, self.ttl_ms]):
            return False
        self._renewed = now
        return True

    def release(self) -> None:
        self._release(keys=[self.key], args=[self.token])
