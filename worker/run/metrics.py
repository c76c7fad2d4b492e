"""Prometheus metrics (served on --metrics-port by worker/cli/metrics_listener.py)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_FAST_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1)


class Metrics:
    """One registry per worker, so several workers (tests, the demo) can live in one process."""

    def __init__(self, labels: dict[str, str]) -> None:
        self.registry = CollectorRegistry()
        names, values = list(labels), list(labels.values())

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(name, doc, names, registry=self.registry).labels(*values)

        def histogram(name: str, doc: str, buckets=_LATENCY_BUCKETS) -> Histogram:
            return Histogram(name, doc, names, buckets=buckets, registry=self.registry).labels(*values)

        self.queue_depth = gauge(
            "conveyor_queue_depth", "Jobs in the requests stream not yet read by the group"
        )
        self.pending = gauge("conveyor_pending_jobs", "Jobs read by the group and not yet acknowledged")
        self.running = gauge("conveyor_running_requests", "Requests running in the engine")
        self.waiting = gauge("conveyor_waiting_requests", "Requests waiting in the engine")
        self.kv_used = gauge("conveyor_kv_blocks_used", "KV cache blocks in use")
        self.kv_total = gauge("conveyor_kv_blocks_total", "KV cache blocks in all")
        self.kv_unwritten = gauge(
            "conveyor_kv_unwritten_ratio",
            "Share of the KV slots held by running sequences that hold no token yet (paged: under a block each)",
        )
        self.tokens_per_s = gauge(
            "conveyor_tokens_per_second", "Output tokens per second over the last interval"
        )
        self.tokens = Counter(
            "conveyor_output_tokens", "Output tokens generated", names, registry=self.registry
        ).labels(*values)
        self.ttft = histogram("conveyor_time_to_first_token_seconds", "Enqueue to first token event")
        self.tpot = histogram(
            "conveyor_time_per_output_token_seconds", "Decode time per output token", _FAST_BUCKETS
        )
        self.queue_time = histogram("conveyor_queue_time_seconds", "Enqueue to admission into the engine")
        self.publish_latency = histogram(
            "conveyor_publish_latency_seconds", "Token sampled to its event written in Redis", _FAST_BUCKETS
        )
        self.redis_full = gauge(
            "conveyor_redis_full", "1 while Redis refuses writes for lack of memory (OOM), else 0"
        )
        self.redis_full_retries = Counter(
            "conveyor_redis_full_retries",
            "Rounds refused by a full Redis and retried",
            names,
            registry=self.registry,
        ).labels(*values)
        # Prefix affinity: what the prefix cache and routing saved, and where jobs were read.
        self.prompt_tokens = Counter(
            "conveyor_prompt_tokens", "Prompt tokens received by the engine", names, registry=self.registry
        ).labels(*values)
        self.prompt_tokens_computed = Counter(
            "conveyor_prompt_tokens_computed",
            "Prompt tokens prefilled, prefix-cache hits excluded (re-admissions after preemption again)",
            names,
            registry=self.registry,
        ).labels(*values)
        self.prefix_cache_hit_rate = gauge(
            "conveyor_prefix_cache_hit_rate", "Share of prompt tokens looked up that the prefix cache held"
        )
        self.home_shards = gauge("conveyor_home_shards", "Shards this worker reads first (its home)")
        self.ownership_changes = Counter(
            "conveyor_shard_ownership_changes",
            "Times this worker's home shards changed (workers joined or left)",
            names,
            registry=self.registry,
        ).labels(*values)
        self._jobs_read = Counter(
            "conveyor_jobs_read", "Jobs read by lane kind", [*names, "source"], registry=self.registry
        )
        self._jobs = Counter("conveyor_jobs", "Jobs by outcome", [*names, "outcome"], registry=self.registry)
        self._label_values = values
        # Per-tenant accounting (worker/fleet/accounting.py): this worker's share; Redis holds the fleet's.
        by_tenant = [*names, "tenant", "model"]
        self._tenant = {
            counter: Counter(f"conveyor_tenant_{counter}", doc, by_tenant, registry=self.registry)
            for counter, doc in (
                ("jobs", "Jobs finished, per tenant and model"),
                ("prompt_tokens", "Prompt tokens of finished jobs, per tenant and model"),
                ("completion_tokens", "Completion tokens of finished jobs, per tenant and model"),
                ("engine_seconds", "Engine step time spent on finished jobs, per tenant and model"),
            )
        }
        self.step_seconds = Counter(
            "conveyor_engine_step_seconds", "Wall time of engine steps", names, registry=self.registry
        ).labels(*values)

    def job(self, outcome: str) -> None:
        self._jobs.labels(*self._label_values, outcome).inc()

    def jobs_read(self, source: str, count: int) -> None:
        """`source`: "home" (a home shard of this worker) or "stolen" (another worker's home shard)."""
        if count:
            self._jobs_read.labels(*self._label_values, source).inc(count)

    def usage(self, tenant: str, model: str, prompt: int, completion: int, engine_s: float) -> None:
        for counter, amount in (
            ("jobs", 1),
            ("prompt_tokens", prompt),
            ("completion_tokens", completion),
            ("engine_seconds", engine_s),
        ):
            self._tenant[counter].labels(*self._label_values, tenant, model).inc(amount)
