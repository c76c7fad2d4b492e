"""The prefix-cache and affinity metrics (worker/run/metrics.py) follow the engine's counters."""

from __future__ import annotations

from engine.outputs import EngineStats
from worker.run.metrics import Metrics
from worker.run.observer import Observer


class Engine:
    def __init__(self) -> None:
        self.s = EngineStats(0, 0, 100, 0, 100, 0, 0, 0, 0)

    def stats(self) -> EngineStats:
        return self.s

    def has_unfinished_requests(self) -> bool:
        return False

    def kv_waste(self) -> tuple[int, int]:
        return 0, 0


def value(metrics: Metrics, name: str, **labels: str) -> float | None:
    return metrics.registry.get_sample_value(name, {"consumer": "w", **labels})


def test_prompt_tokens_received_and_computed_and_the_hit_rate():
    metrics, engine = Metrics({"consumer": "w"}), Engine()
    observer = Observer(metrics)
    for received, queried, hits in [(100, 100, 0), (400, 400, 240)]:
        engine.s = EngineStats(0, 0, 100, 0, 100, queried, hits, 0, 0, num_prompt_tokens=received)
        observer._last_rate -= 2  # a second has passed: the metrics are refreshed
        observer.stepped(0, engine)
    assert value(metrics, "conveyor_prompt_tokens_total") == 400
    assert value(metrics, "conveyor_prompt_tokens_computed_total") == 400 - 240
    assert value(metrics, "conveyor_prefix_cache_hit_rate") == 240 / 400


def test_jobs_read_from_home_and_stolen_are_counted_apart():
    metrics = Metrics({"consumer": "w"})
    metrics.jobs_read("home", 5)
    metrics.jobs_read("stolen", 2)
    metrics.jobs_read("home", 1)
    assert value(metrics, "conveyor_jobs_read_total", source="home") == 6
    assert value(metrics, "conveyor_jobs_read_total", source="stolen") == 2
