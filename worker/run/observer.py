"""What the loop reports as it goes: Prometheus metrics and the registry record (benchmarks' traces are
worker/run/hooks.py's).

The Worker calls these hooks at fixed points of its loop and never reads anything back, so what is
measured can change without touching the loop.
"""

from __future__ import annotations

import time

import structlog

from worker.fleet.accounting import DEFAULT_TENANT
from worker.fleet.heartbeat import Heartbeat
from worker.run.engine_room import engine_room
from worker.run.metrics import Metrics
from worker.wire.job_record import InFlight

log = structlog.get_logger("conveyor.worker")
# The registry record's running/waiting/KV use are refreshed this often (Heartbeat.load): peers decide whether
# this worker's shards may be stolen by them (worker/fleet/home_watch.py).
LOAD_EVERY_S = 0.05


class Observer:
    """Metrics and the registry record."""

    def __init__(self, metrics: Metrics, heartbeat: Heartbeat | None = None) -> None:
        self.metrics = metrics
        self.heartbeat = heartbeat  # the registry record (worker/fleet/heartbeat.py), when registered
        self._last_rate = time.monotonic()
        self._last_load = 0.0  # when the heartbeat was last given the engine's running/waiting/KV use
        self._tokens_since_rate = 0
        self._prompt_counts = (0, 0)  # the engine's (received, computed) prompt tokens last reported

    def started(self) -> None:
        """The worker holds its consumer name and reads its streams: it may register (once per process,
        whichever of a sharded worker's shards starts first)."""
        if self.heartbeat is not None:
            self.heartbeat.start()

    def admitted(self, job: InFlight) -> None:
        self.metrics.queue_time.observe(max(0.0, job.admitted_ms - job.enqueued_ms) / 1000)

    def outcome(self, outcome: str) -> None:
        self.metrics.job(outcome)

    def first_token(self, job: InFlight, now_ms: float) -> None:
        ttft_ms = max(0.0, now_ms - job.enqueued_ms)
        self.metrics.ttft.observe(ttft_ms / 1000)
        if self.heartbeat is not None:
            self.heartbeat.first_token(ttft_ms)

    def finished(self, job: InFlight, now_ms: float) -> None:
        reason = job.finished[0].finish_reason
        self.outcome(job.stop_reason if reason == "abort" and job.stop_reason else reason)
        tokens = sum(s.num_output_tokens for s in job.finished.values())
        if job.first_token_ms is not None and tokens > 1:
            self.metrics.tpot.observe((now_ms - job.first_token_ms) / 1000 / (tokens - 1))
        log.info("job finished", request_id=job.job_id, finish_reason=reason, completion_tokens=tokens)
        if self.heartbeat is not None:
            self.heartbeat.job_finished()

    def accounted(self, job: InFlight, model: str) -> None:
        """A finished job's usage, as its terminal write adds it to Redis (worker/fleet/accounting.py)."""
        tokens = sum(s.num_output_tokens for s in job.finished.values())
        tenant = job.job.tenant or DEFAULT_TENANT
        self.metrics.usage(tenant, model, job.prompt_tokens, tokens, job.engine_s)

    def engine_stepped(self, seconds: float) -> None:
        self.metrics.step_seconds.inc(seconds)

    def published(self, latency_s: float) -> None:
        """Token sampled -> its round's EXEC reply read."""
        self.metrics.publish_latency.observe(latency_s)

    def stepped(self, new_tokens: int, engine, busy: bool = True) -> None:
        """After a tick; `busy`: the engine ran a step in it."""
        self._tokens_since_rate += new_tokens
        now = time.monotonic()
        if self.heartbeat is not None and now - self._last_load >= LOAD_EVERY_S:
            self._last_load = now
            stats = engine.stats()
            self.heartbeat.load(stats, engine_room(engine, stats))
        if now - self._last_rate < 1.0:
            # The last step of a busy spell: the registry must not keep showing its running jobs.
            if self.heartbeat is not None and busy and not engine.has_unfinished_requests():
                stats = engine.stats()
                self.heartbeat.update(stats, engine_room(engine, stats), stepped=True)
            return
        stats = engine.stats()
        if self.heartbeat is not None:
            self.heartbeat.update(stats, engine_room(engine, stats), stepped=busy)
        m = self.metrics
        m.running.set(stats.num_running)
        m.waiting.set(stats.num_waiting)
        m.kv_used.set(stats.num_kv_blocks_used)
        m.kv_total.set(stats.num_kv_blocks_total)
        unwritten, held = engine.kv_waste()
        m.kv_unwritten.set(unwritten / held if held else 0.0)
        m.tokens.inc(self._tokens_since_rate)
        m.tokens_per_s.set(self._tokens_since_rate / (now - self._last_rate))
        self._tokens_since_rate, self._last_rate = 0, now
        received, computed = stats.num_prompt_tokens, stats.num_prompt_tokens_computed
        m.prompt_tokens.inc(max(0, received - self._prompt_counts[0]))
        m.prompt_tokens_computed.inc(max(0, computed - self._prompt_counts[1]))
        self._prompt_counts = (received, computed)
        m.prefix_cache_hit_rate.set(stats.prefix_cache_hit_rate)

    def group_info(self, lag: int, pending: int) -> None:
        self.metrics.queue_depth.set(lag)
        self.metrics.pending.set(pending)

    def redis_full(self, full: bool) -> None:
        self.metrics.redis_full.set(1 if full else 0)
        if full:
            self.metrics.redis_full_retries.inc()
