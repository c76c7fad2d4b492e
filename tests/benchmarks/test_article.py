"""benchmarks/article.py end to end at its quick sizes on the tiny model, and the arrival replay's clock
against a scripted engine."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks import article_charts
from benchmarks.arrival_replay import poisson_times, replay
from benchmarks.workload import Job

ROOT = Path(__file__).resolve().parents[2]
CHARTS = ("static_vs_continuous", "paged_vs_contiguous", "max_num_seqs", "max_wait_ms", "block_size")


def test_quick_run_on_the_tiny_model_writes_json_and_charts(tmp_path):
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "CONVEYOR_CACHE": str(tmp_path / "cache"),
        "HF_HUB_OFFLINE": "1",
    }
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "article.py"), "--quick", "--model", "tiny"]
        + ["--threads", "1", "--out-dir", str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((out / "article-tiny-quick.json").read_text())
    assert sorted(p.name for p in out.glob("*.png")) == sorted(f"{c}-tiny-quick.png" for c in CHARTS)
    results, sizes = report["results"], report["sizes"]
    assert [(r["scheduling"], r["rate"]) for r in results["batching"]] == [
        (s, rate) for s in ("continuous", "static") for rate in (4.0, "all_at_once")
    ]
    for row in results["batching"] + results["max_num_seqs"] + results["block_size"]:
        assert row["requests"] == sizes["num_requests"]
        assert all(1 <= n <= sizes["max_output"] for n in row["output_lengths"])
    reserve, paged = results["paging"]
    assert (reserve["kv_allocation"], paged["kv_allocation"]) == ("reserve_max", "paged")
    # The budget holds exactly budget_reservations contiguous reservations; paged blocks hold more.
    assert reserve["most_concurrent_seqs"] == sizes["budget_reservations"] < paged["most_concurrent_seqs"]
    assert reserve["kv_waste_mean"] > paged["kv_waste_mean"]
    assert [r["max_wait_ms"] for r in results["max_wait_ms"]] == sizes["wait_sweep_ms"]
    lone = [r["lone"]["ttft_p50_s"] for r in results["max_wait_ms"]]
    assert lone[1] >= 0.05 > lone[0]  # a lone request waits out max_wait_ms (50) before its first step
    assert set(report["claims"]) and report["load_average_before"]
    for png in out.glob("*.png"):  # the charts can be redrawn from the JSON alone
        png.unlink()
    article_charts.main([str(out / "article-tiny-quick.json")])
    assert sorted(p.name for p in out.glob("*.png")) == sorted(f"{c}-tiny-quick.png" for c in CHARTS)


@dataclass
class ScriptedEngine:
    """One token per running request per step, each step taking `step_s`; answers `length` tokens long."""

    max_num_seqs: int
    length: int = 2
    step_s: float = 0.0
    added: list[str] = field(default_factory=list)
    left: dict[str, int] = field(default_factory=dict)

    @property
    def config(self):
        return self

    def add_request(self, rid, prompt, params):
        self.added.append(rid)
        self.left[rid] = self.length

    def has_unfinished_requests(self):
        return bool(self.left)

    def step(self):
        import time

        time.sleep(self.step_s)
        running = list(self.left)[: self.max_num_seqs]
        deltas = []
        for rid in running:
            self.left[rid] -= 1
            finished = self.left[rid] == 0
            if finished:
                del self.left[rid]
            deltas.append(_Delta(rid, [7], finished))
        self._last = running
        return deltas

    def kv_waste(self):
        return (0, 0)

    def step_tokens(self):
        return dict.fromkeys(self._last, 1)

    def stats(self):
        return _Stats()


@dataclass
class _Delta:
    request_id: str
    new_token_ids: list[int]
    finished: bool


@dataclass
class _Stats:
    num_preemptions: int = 0


def test_an_idle_engine_waits_max_wait_then_starts_and_a_full_batch_starts_at_once():
    jobs = [Job([1, 2], 2)] * 3
    # Alone: the request arrives at 10 s and waits the whole 0.5 s window before the first step.
    alone = replay(ScriptedEngine(max_num_seqs=4), jobs[:1], [10.0], max_wait_s=0.5)
    assert math.isclose(alone["ttft_p50_s"], 0.5, abs_tol=0.01)
    # Three arrivals fill a batch of 3 at 10.2 s: the step starts then, not at the window's end (10.5 s).
    full = replay(ScriptedEngine(max_num_seqs=3), jobs, [10.0, 10.1, 10.2], max_wait_s=0.5)
    assert math.isclose(full["ttft_p99_s"], 0.2, abs_tol=0.01) and full["most_concurrent_seqs"] == 3
    # Without a window each arrival starts at once; a busy engine takes arrivals between its steps.
    eager = replay(ScriptedEngine(max_num_seqs=3, step_s=0.01), jobs, [10.0, 10.001, 10.002])
    assert eager["ttft_p50_s"] < 0.05 and eager["output_tokens"] == 6


def test_poisson_times_are_seeded_and_sorted_and_inf_is_a_burst():
    times = poisson_times(50, 2.0, seed=3)
    assert times == sorted(times) == poisson_times(50, 2.0, seed=3)
    assert 10 < times[-1] < 50  # about 25 s for 50 arrivals at 2 per second
    assert poisson_times(4, math.inf) == [0.0] * 4
