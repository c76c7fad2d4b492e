"""Each gateway replica's batch drivers: a thread that looks for open batches nobody drives (their lease key
is free: never taken, or its holder died and stopped renewing it), takes their leases, and drives each on a
thread of its own (driver.py), up to `max_batches` at once.

A replica that stops (or is killed) leaves its leases to expire; another replica's pool then takes them.
"""

from __future__ import annotations

import threading

import redis
import structlog

from worker.batch.batch_lease import BatchLease, Handover
from worker.batch.batch_store import LeaseLost
from worker.batch.driver import BatchDriver

log = structlog.get_logger("conveyor.batches")


class DriverPool:
    def __init__(self, driver: BatchDriver, holder: str) -> None:
        self.driver, self.holder = driver, holder
        self.cfg = driver.cfg
        self._driving: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Start looking for batches (again, after a stop: an app may be started more than once)."""
        self._stopping.clear()
        self._thread = threading.Thread(target=self._loop, name="batch-drivers", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        """Stops taking batches and hands the batches it drives over: each driver stops at its next check
        and releases its lease, so another replica continues at once (a killed replica's leases expire
        instead)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        with self._lock:
            threads = list(self._driving.values())
        for thread in threads:
            thread.join(timeout=timeout_s)

    def driving(self) -> list[str]:
        with self._lock:
            return sorted(self._driving)

    def _loop(self) -> None:
        while not self._stopping.is_set():
            try:
                self._take_free_batches()
            except redis.RedisError as exc:
                log.warning("batch pool could not read Redis", error=str(exc))
            self._stopping.wait(self.cfg.poll_s)

    def _take_free_batches(self) -> None:
        for batch_id in self.driver.store.open_ids():
            with self._lock:
                if batch_id in self._driving:
                    continue
                if len(self._driving) >= self.cfg.max_batches:
                    return
            lease = BatchLease(
                self.driver.client, self.driver.keys.batch(batch_id, "lease"), self.cfg.lease_ms, self.holder
            )
            if not lease.acquire():
                continue
            thread = threading.Thread(
                target=self._drive, args=(batch_id, lease), name=f"batch-{batch_id}", daemon=True
            )
            with self._lock:
                self._driving[batch_id] = thread
            thread.start()

    def _drive(self, batch_id: str, lease: BatchLease) -> None:
        log.info("driving batch", batch=batch_id, holder=self.holder)
        try:
            self.driver.drive(batch_id, lease, self._stopping)
        except Handover:
            lease.release()
            log.info("batch handed over: this replica stops", batch=batch_id)
        except LeaseLost:
            log.warning("batch lease lost: another replica drives it now", batch=batch_id)
        except Exception:  # the lease expires and a replica (maybe this one) tries again
            log.exception("batch driver failed", batch=batch_id)
        finally:
            with self._lock:
                self._driving.pop(batch_id, None)
