"""A worker's registry record kept fresh (registry.py): written every `interval_s` from a thread of its own.

The loop never waits on the registry: it hands the engine's numbers over (`update`, from Observer.stepped on
the loop's thread, so the engine is only read there) and this thread writes the newest record with SET PX
and ZADD. A worker whose loop is stuck in a long step still beats, and `last_step_ms` shows how long the
step has taken; a killed worker stops beating and its record lapses one TTL later. A clean stop deletes the
record and its index entry.

A beat Redis refuses (full under noeviction, or unreachable) is logged once and retried with backoff up
to the interval; it never stops the worker, the first one included: a worker that starts on a full Redis
serves once there is room, and is in the registry from its first beat that fits.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from importlib import metadata

import structlog

from engine.outputs import EngineStats
from worker.connection import Backoff
from worker.fleet.registry import FORGET_MS, TTFT_KEPT, WorkerRecord
from worker.keys import Keys

log = structlog.get_logger("conveyor.worker")

DEFAULT_INTERVAL_S = 2.0
TTL_BEATS = 3  # the record outlives this many missed heartbeats
IDLE_MS = 2_000  # no step for this long: the record's rates read 0
STOP_WAIT_S = 1.0  # how long a stop waits for the last beat, then for leaving the registry


def package_version() -> str:
    try:
        return metadata.version("conveyor")
    except metadata.PackageNotFoundError:
        return "unknown"


def now_ms() -> int:
    return int(time.time() * 1000)


class Heartbeat:
    def __init__(
        self,
        client,
        keys: Keys,
        *,
        consumer: str,
        model: str,
        group: str,
        streams: list[str],
        max_model_len: int,
        capacity: int,
        interval_s: float = DEFAULT_INTERVAL_S,
        draining: Callable[[], bool] = lambda: False,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("the heartbeat interval must be > 0")
        self.client, self.keys, self.interval_s = client, keys, interval_s
        self.draining = draining
        self.ttl_ms = int(TTL_BEATS * interval_s * 1000)
        self.record = WorkerRecord(
            consumer=consumer,
            model=model,
            group=group,
            streams=streams,
            host=socket.gethostname(),
            pid=os.getpid(),
            version=package_version(),
            max_model_len=max_model_len,
            capacity=capacity,
            started_ms=now_ms(),
            heartbeat_ms=now_ms(),
            ttl_ms=self.ttl_ms,
        )
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        # Cumulative engine counters at the last rate computation: (monotonic s, tokens out, tokens in).
        self._rate_base: tuple[float, int, int] | None = None
        self._jobs_finished = 0  # since the last rate computation
        # running, waiting and KV blocks used as the loop saw them last (load()), written at the next beat:
        # fresher than update()'s, which the loop calls about once a second.
        self._load: dict[str, int] | None = None
        self._ttfts: deque[int] = deque(maxlen=TTFT_KEPT)
        self._backoff = Backoff(cap_s=interval_s)  # failures in a row: the next try comes sooner

    def first_token(self, ttft_ms: float) -> None:
        self._ttfts.append(round(ttft_ms))

    def job_finished(self) -> None:
        self._jobs_finished += 1

    # ---- the loop's side --------------------------------------------------------------------------------
    def update(self, stats: EngineStats, room: int, stepped: bool) -> None:
        """The engine's numbers now and the jobs it could start (worker/run/engine_room.py); `stepped`:
        the engine just ran a step. Rates are over >= 1 s windows of the engine's cumulative counters."""
        now = time.monotonic()
        out_total = stats.num_generated_tokens
        in_total = stats.prefix_cache_queries - stats.prefix_cache_hits
        changes: dict = {
            **_load(stats, room),
            "kv_blocks_total": stats.num_kv_blocks_total,
            "prompt_tokens": stats.num_prompt_tokens,
            "prefix_cache_queries": stats.prefix_cache_queries,
            "prefix_cache_hits": stats.prefix_cache_hits,
            "ttft_ms_recent": list(self._ttfts),
        }
        if stepped:
            changes["last_step_ms"] = now_ms()
        base = self._rate_base
        if base is None:
            self._rate_base = (now, out_total, in_total)
        elif now - base[0] >= 1.0:
            elapsed = now - base[0]
            changes["tokens_out_per_s"] = (out_total - base[1]) / elapsed
            changes["tokens_in_per_s"] = (in_total - base[2]) / elapsed
            changes["jobs_per_s"] = self._jobs_finished / elapsed
            self._jobs_finished = 0
            self._rate_base = (now, out_total, in_total)
        with self._lock:
            self.record = self.record.model_copy(update=changes)
            self._load = None

    def load(self, stats: EngineStats, room: int) -> None:
        """The engine's running and waiting jobs, KV use and room now (the loop, often): shown from the
        next beat. Peers steal from a worker without room by them (worker/fleet/home_watch.py), so they
        must not lag a second behind the beat; the KV use comes along so that a record never shows jobs
        running in an empty KV pool."""
        self._load = _load(stats, room)

    def set_streams(self, streams: list[str]) -> None:
        """The request streams this worker reads now (a lane added at run time), shown from the next beat."""
        with self._lock:
            self.record = self.record.model_copy(update={"streams": list(streams)})

    def set_home_shards(self, shards: list[int]) -> None:
        """The shards this worker reads first now (worker/fleet/home_watch.py), shown from the next beat."""
        with self._lock:
            self.record = self.record.model_copy(update={"home_shards": shards})

    # ---- the thread -------------------------------------------------------------------------------------
    def start(self) -> None:
        """Register and keep beating; a second call does nothing. Called once the worker holds its consumer
        name (Observer.started), so a worker refused for a name in use never touches the live one's record."""
        if self._thread is not None:
            return
        wait_s = self._try_beat()  # registered before the first job is read, unless Redis refuses it now
        self._thread = threading.Thread(
            target=self._run, args=(wait_s,), name="conveyor-heartbeat", daemon=True
        )
        self._thread.start()

    def _run(self, wait_s: float) -> None:
        while not self._stop.wait(wait_s):
            wait_s = self._try_beat()

    def _try_beat(self) -> float:
        """One beat, and how long until the next: the interval, or after a failure a backoff delay that
        grows to the interval. A failure is logged at its first try and when it passes."""
        try:
            self.beat()
        except Exception as exc:  # Redis full or away: the loop copes on its own; the registry waits
            if not self._backoff.failures:
                log.warning("registry heartbeat failed, retrying", error=str(exc))
            return self._backoff.next_delay()
        if self._backoff.failures:
            log.info("registry heartbeat written again", after_failures=self._backoff.failures)
            self._backoff.reset()
        return self.interval_s

    def beat(self) -> None:
        at = now_ms()
        with self._lock:
            changes: dict = {"heartbeat_ms": at, "draining": self.draining()}
            if self._load is not None:
                changes.update(self._load)
            last = self.record.last_step_ms
            if last is None or at - last > IDLE_MS:  # idle: not the rates of the last busy second
                changes.update(tokens_out_per_s=0.0, tokens_in_per_s=0.0, jobs_per_s=0.0)
            self.record = record = self.record.model_copy(update=changes)
        pipe = self.client.pipeline(transaction=False)
        pipe.set(self.keys.worker(record.consumer), record.model_dump_json(), px=self.ttl_ms)
        pipe.zadd(self.keys.workers, {record.consumer: at})
        pipe.zremrangebyscore(self.keys.workers, "-inf", at - FORGET_MS)
        pipe.execute()

    def stop(self, remove: bool = True, wait_s: float = STOP_WAIT_S) -> None:
        """Stop beating; with `remove`, leave the registry (a clean stop: not shown as lost). Never waits
        on Redis for more than about 2 x `wait_s`: a worker stopping while its network is frozen must exit
        within its drain bound, and its record then lapses on its own one TTL later."""
        self._stop.set()
        if self._thread is None:
            return  # never registered
        self._thread.join(timeout=wait_s)
        if not remove or self._thread.is_alive():  # a beat still hangs on Redis: do not queue behind it
            return
        leaving = threading.Thread(target=self._leave, name="conveyor-registry-leave", daemon=True)
        leaving.start()
        leaving.join(timeout=wait_s)

    def _leave(self) -> None:
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.delete(self.keys.worker(self.record.consumer))
            pipe.zrem(self.keys.workers, self.record.consumer)
            pipe.execute()
        except Exception as exc:
            log.warning("could not leave the registry; the record lapses on its own", error=str(exc))


def _load(stats: EngineStats, room: int) -> dict[str, int]:
    """The record's fields that change every step: what load() refreshes between update()s."""
    return {
        "room": room,
        "running": stats.num_running,
        "waiting": stats.num_waiting,
        "kv_blocks_used": stats.num_kv_blocks_used,
    }
