"""The fleet's Prometheus metrics, from one FleetSnapshot per scrape: what autoscalers and billing read.

Exported by the process that reads the whole fleet (`conveyor dashboard`, and `conveyor serve` where it
mounts the dashboard), not by workers: a worker sees its own engine, while the backlog, its drain time
and the usage counters belong to the model and the fleet. One exporter is enough; several give the same
numbers (every value is read from Redis at scrape time).

Per model (label `model`): backlog jobs, estimated backlog tokens, oldest wait, drain time
(`conveyor_backlog_drain_seconds`, which the KEDA ScaledObject's Prometheus trigger reads), pending jobs,
live workers. Per tenant and model: the usage counters of worker/fleet/accounting.py, summed over the fleet.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from worker.fleet.snapshot import FleetSnapshot


class FleetCollector(Collector):
    def __init__(self, snapshot: Callable[[], FleetSnapshot]) -> None:
        self.snapshot = snapshot

    def collect(self) -> Iterator:
        snap = self.snapshot()
        per_model = {
            "conveyor_backlog_jobs": ("Jobs in the model's request streams not yet read", "backlog"),
            "conveyor_backlog_tokens": (
                "Estimated tokens of the backlog: backlog x mean prompt + completion tokens per job",
                "backlog_tokens",
            ),
            "conveyor_backlog_oldest_wait_seconds": ("Age of the oldest job not yet read", "oldest_wait_s"),
            "conveyor_backlog_drain_seconds": (
                "Estimated time to serve the backlog at the fleet's current rate (86400: nobody serving)",
                "drain_s",
            ),
            "conveyor_fleet_pending_jobs": ("Jobs read by workers and not yet acknowledged", "pending"),
            "conveyor_fleet_workers": ("Live workers serving the model", "workers"),
        }
        for name, (doc, attr) in per_model.items():
            family = GaugeMetricFamily(name, doc, labels=["model"])
            for m in snap.models:
                value = getattr(m, attr)
                family.add_metric([m.model], 0.0 if value is None else float(value))
            yield family
        usage = {
            "conveyor_usage_jobs": ("Jobs finished (fleet, from Redis)", "jobs"),
            "conveyor_usage_prompt_tokens": ("Prompt tokens of finished jobs (fleet)", "prompt_tokens"),
            "conveyor_usage_completion_tokens": (
                "Completion tokens of finished jobs (fleet)",
                "completion_tokens",
            ),
            "conveyor_usage_engine_seconds": ("Engine step time of finished jobs (fleet)", "engine_seconds"),
        }
        for name, (doc, attr) in usage.items():
            counter = CounterMetricFamily(name, doc, labels=["tenant", "model"])
            for u in snap.tenants:
                counter.add_metric([u.tenant, u.model], float(getattr(u, attr)))
            yield counter
