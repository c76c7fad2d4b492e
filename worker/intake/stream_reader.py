"""Reading jobs from the requests stream: new entries in a step's round, a blocking read while idle, this
consumer's own pending entries at start, and the consumer group itself.

Reads ask only for as many jobs as the engine has room for, so a busy worker leaves work to idle ones.
"""

from __future__ import annotations

import time
from functools import partial
from typing import Any

import redis
import structlog

from worker.config import WorkerConfig
from worker.connection import Backoff, Waiter, with_retry
from worker.recover.redis_health import RedisHealth
from worker.wire.exchange import execute_plain
from worker.wire.job_record import Arrived
from worker.wire.round import Round

log = structlog.get_logger("conveyor.worker")


class Reader:
    def __init__(
        self, client: redis.Redis, cfg: WorkerConfig, stop: Waiter, idle_stop: Waiter, health: RedisHealth
    ) -> None:
        self.client, self.cfg = client, cfg
        self.stop, self.idle_stop, self.health = stop, idle_stop, health
        self.backoff = Backoff()

    def add_new(self, rnd: Round, count: int, arrived: list[Arrived], block_ms: int | None = None) -> None:
        """XREADGROUP ... > for up to `count` entries; they are appended to `arrived` at dispatch."""
        cfg = self.cfg

        def handle(reply) -> None:
            if isinstance(reply, Exception):
                if str(reply).startswith("NOGROUP"):
                    return
                raise reply
            for _stream, entries in reply or []:
                arrived.extend(Arrived(eid, fields) for eid, fields in entries)

        rnd.add(
            lambda p: p.xreadgroup(
                cfg.group, cfg.consumer, {cfg.keys.requests: ">"}, count=count, block=block_ms
            ),
            handle,
        )

    def wait(self, room: int, arrived: list[Arrived]) -> None:
        """Idle: block on XREADGROUP, then gather for up to max_wait_ms to fill the first batch."""
        self._blocking_read(room, self.cfg.block_ms, arrived)
        if not arrived or self.cfg.max_wait_ms <= 0:
            return
        deadline = time.monotonic() + self.cfg.max_wait_ms / 1000
        while len(arrived) < room and (left := deadline - time.monotonic()) > 0:
            self._blocking_read(room - len(arrived), max(1, int(left * 1000)), arrived)

    def _blocking_read(self, count: int, block_ms: int, arrived: list[Arrived]) -> None:
        rnd = Round()
        self.add_new(rnd, count, arrived, block_ms)

        # Blocking reads cannot run inside MULTI: a plain pipeline. Idle, so any stop request ends the
        # wait: there is nothing to drain.
        results = with_retry(
            lambda: execute_plain(self.client, rnd),
            "waiting for jobs",
            self.idle_stop,
            self.backoff,
            self.health,
        )
        if any(isinstance(r, redis.ResponseError) and str(r).startswith("NOGROUP") for r in results):
            self.ensure_group()
        rnd.dispatch(results)

    def own_pending(self) -> list[Arrived]:
        """A worker restarted under the same name first finishes what is still pending under that name."""
        cfg, found, start = self.cfg, list[Arrived](), b"0"
        while True:
            # Any: redis-py types replies for both decode modes; this client's are bytes (worker.connection).
            reply: Any = with_retry(
                partial(
                    self.client.xreadgroup, cfg.group, cfg.consumer, {cfg.keys.requests: start}, count=500
                ),
                "reading own pending entries",
                self.stop,
            )
            entries = reply[0][1] if reply else []
            if not entries:
                return found
            found.extend(Arrived(eid, fields, reclaimed=True) for eid, fields in entries)
            start = entries[-1][0]

    def ensure_group(self) -> None:
        def create() -> None:
            try:
                self.client.xgroup_create(self.cfg.keys.requests, self.cfg.group, id="0", mkstream=True)
                log.info("consumer group created", group=self.cfg.group, stream=self.cfg.keys.requests)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

        with_retry(create, "creating the consumer group", self.stop, health=self.health)
