"""Cancellation requests: PUBLISH <prefix>:cancel <id> (heard here, on a thread) or SET <prefix>:cancel:<id>
(checked by the loop each round, see run/loop.py). The loop drains `take()` before each step."""

from __future__ import annotations

import threading

import redis
import structlog

from worker.connection import DOWN_ERRORS, Backoff
from worker.wire.slot_following import ShardMoved

log = structlog.get_logger("conveyor.cancel")


class CancelListener:
    def __init__(self, client: redis.Redis, channel: str, sharded: bool = False) -> None:
        # sharded: Redis Cluster's SSUBSCRIBE (clients SPUBLISH to the shard's channel, docs/protocol.md).
        self.client, self.channel, self.sharded = client, channel, sharded
        self._ids: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="conveyor-cancel", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.ident is not None:  # started
            self._thread.join(timeout=3)

    def take(self) -> set[str]:
        with self._lock:
            ids, self._ids = self._ids, set()
        return ids

    def _run(self) -> None:
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                pubsub = self.client.pubsub(ignore_subscribe_messages=True)
                if self.sharded:
                    pubsub.ssubscribe(self.channel)
                else:
                    pubsub.subscribe(self.channel)
                backoff.reset()
                while not self._stop.is_set():
                    message = pubsub.get_message(timeout=0.5)
                    if message and message.get("type") in (b"message", "message", b"smessage", "smessage"):
                        self._add(message["data"])
                pubsub.close()
            except redis.exceptions.NoPermissionError as exc:  # an ACL without (s)subscribe: no retry helps
                log.error("cancel channel refused (ACL): cancels by key only", error=str(exc))
                return
            # ShardMoved: cluster mode, until the worker rebuilt. TypeError / AttributeError: in cluster mode
            # the pool that follows a moved slot closes this connection from another thread, and redis-py
            # then fails inside its read on the closed socket.
            except (*DOWN_ERRORS, ShardMoved, TypeError, AttributeError) as exc:
                delay = backoff.next_delay()
                log.warning("cancel channel lost, resubscribing", error=str(exc), retry_in_s=delay)
                self._stop.wait(delay)

    def _add(self, data: bytes) -> None:
        try:
            job_id = data.decode("utf-8").strip()
        except (UnicodeDecodeError, AttributeError):
            return  # garbage on the channel is ignored
        with self._lock:
            self._ids.add(job_id)
