"""One live worker per consumer name: a lease key `<prefix>:consumer:<group>:<name>` holding a token of
this process, set with NX and a TTL of max(lease_ms, 3 * block_ms), renewed with the job leases.

Two workers under one `--consumer` would read each other's pending entries as their own and race on every
write, so a second one does not run. At start a worker whose name is leased waits up to one lease for it
to lapse (so a worker restarted right after a crash under the same name gets in as soon as its old
lease expires) and refuses to start if it is still held after that: another worker is alive under it.
"""

from __future__ import annotations

import time
import uuid

import redis
import structlog

from worker.config import WorkerConfig
from worker.connection import Waiter, with_retry
from worker.wire.lua_script import Script
from worker.wire.round import Round

log = structlog.get_logger("conveyor.worker")

# Renew or release only while the key still holds our token. KEYS: the lease key. ARGV: token, ttl ms (0: release).
_CHECKED = """
local held = redis.call('GET', KEYS[1])
if held and held ~= ARGV[1] then return 0 end
if ARGV[2] == '0' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2]) end
return 1
"""


class ConsumerNameTaken(RuntimeError):
    pass


class ConsumerLease:
    def __init__(self, client: redis.Redis, cfg: WorkerConfig) -> None:
        self.client, self.cfg = client, cfg
        self.key = f"{cfg.keys.prefix}:consumer:{cfg.group}:{cfg.consumer}"
        self.token = uuid.uuid4().hex
        # Renewed with the heartbeat, which an idle worker sends only between blocking reads of block_ms.
        self.ttl_ms = max(cfg.lease_ms, 3 * cfg.block_ms)
        self.script = Script(_CHECKED)
        self.owed = False  # a renewal Redis did not run (the script was unknown): sent in the next round

    def acquire(self, stop: Waiter) -> None:
        """Take the name, waiting up to one lease for a previous holder's lease to lapse."""
        give_up = time.monotonic() + self.ttl_ms / 1000 + 0.5
        warned = False
        while True:
            took = with_retry(self._take, "taking the consumer name", stop)
            if took:
                return
            if time.monotonic() > give_up or stop.expired():
                raise ConsumerNameTaken(
                    f"consumer name {self.cfg.consumer!r} (group {self.cfg.group!r}) is in use by another "
                    f"live worker: its lease {self.key} was renewed for longer than {self.ttl_ms} ms. "
                    "Give each worker its own --consumer."
                )
            if not warned:
                log.warning(
                    "consumer name leased by another worker; waiting for its lease to lapse",
                    consumer=self.cfg.consumer,
                    key=self.key,
                    wait_up_to_ms=self.ttl_ms,
                )
                warned = True
            stop.sleep(0.05)

    def _take(self) -> bool:
        """The name is free (now ours), or already held with our token: by a sibling lane of this process
        that shares this lease key (run/loop.py, lanes with shared job keys)."""
        if self.client.set(self.key, self.token, nx=True, px=self.ttl_ms):
            return True
        return self.client.get(self.key) in (self.token, self.token.encode())

    def add_renewal(self, rnd: Round) -> None:
        self.owed = False
        self.script.add(rnd, [self.key], [self.token, self.ttl_ms], self._renewed)

    def add_owed(self, rnd: Round) -> None:
        if self.owed:
            self.add_renewal(rnd)

    def _renewed(self, reply) -> None:
        if self.script.unknown(reply):
            self.owed = True
        elif reply == 0:
            log.error(
                "consumer name taken over by another worker while this one was cut off from Redis",
                consumer=self.cfg.consumer,
                key=self.key,
            )

    def release(self) -> None:
        self.client.eval(_CHECKED, 1, self.key, self.token, 0)
