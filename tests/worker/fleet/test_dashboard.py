"""The dashboard (worker/fleet/dashboard/) in headless Chromium against a real worker process: after the
fleet served jobs, the DOM shows non-zero series in every chart; the screenshot is kept under pytest's tmp
dir (a test artefact, not committed). Also: the page works offline (no URL outside the app) and the
fleet's Prometheus metrics include the drain-time gauge the KEDA trigger reads."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from html.parser import HTMLParser

import httpx
import pytest

from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import spawn_worker
from worker.client import collect, enqueue
from worker.fleet import registry
from worker.keys import Keys
from worker.local_redis import free_port

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class Series(HTMLParser):
    """chart name -> {series name: (data-max, data-points)} from the page's `latest-*` boxes."""

    def __init__(self) -> None:
        super().__init__()
        self.charts: dict[str, dict[str, tuple[float, int]]] = {}
        self.tenant_cells: list[str] = []
        self._chart: str | None = None
        self._in_tenants = False
        self._in_td = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "div" and (a.get("id") or "").startswith("latest-"):
            self._chart = a["id"].removeprefix("latest-")
            self.charts[self._chart] = {}
        elif tag == "span" and self._chart and "data-series" in a:
            self.charts[self._chart][a["data-series"]] = (float(a["data-max"]), int(a["data-points"]))
        elif tag == "table" and a.get("id") == "tenants":
            self._in_tenants = True
        elif tag == "td" and self._in_tenants:
            self._in_td = True

    def handle_endtag(self, tag):
        if tag == "div":
            self._chart = None
        elif tag == "table":
            self._in_tenants = False
        elif tag == "td":
            self._in_td = False

    def handle_data(self, data):
        if self._in_td:
            self.tenant_cells.append(data)


def chromium(url: str, *args: str) -> str:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=6000", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120).stdout


@pytest.mark.redis
@pytest.mark.timeout(300)
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium")
def test_charts_show_non_zero_series_after_the_fleet_served_jobs(redis_server, r, tiny_model, tmp_path):
    worker = spawn_worker(
        redis_server.url, tiny_model, "dashw", tmp_path / "w.log", "--registry-interval", "0.5"
    )
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    dashboard = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "worker.cli",
            "dashboard",
            "--redis-url",
            redis_server.url,
            "--port",
            str(port),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(tmp_path / "dashboard.log", "wb"),
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: registry.live(registry.read(r, Keys())), 90, "the worker's record", 0.2)
        wait_until(lambda: _get(base + "/api/snapshot"), 30, "the dashboard up", 0.2)
        page = httpx.get(base + "/").text
        assert "//" not in page.replace("http://www.w3.org", "")  # offline: every URL is the app's own
        r.xadd(Keys().requests, {"job": b"{not json"})  # one dead letter
        for k in range(24):  # more than its 16 slots: a backlog while the charts poll
            enqueue(r, _job(f"j{k}") | ({"tenant": "acme"} if k % 2 else {}))
        # The page charts only what it polls after it loads, and the worker may clear 24 jobs before
        # Chromium has started: jobs are topped up while it runs, so the backlog it polls is never empty.
        # Chromium's virtual time runs the page's polls within about a second, a beat or two of the
        # registry: it starts once the worker's record shows it busy.
        with backlog_kept(r, Keys().requests):
            wait_until(lambda: _busy(r), 30, "the worker's record to show it busy", 0.05)
            dom = chromium(base + "/", "--dump-dom")
        found = Series()
        found.feed(dom)
        charts = found.charts
        model = registry.live(registry.read(r, Keys()))[0].model
        assert charts["backlog"][model][0] > 0
        assert charts["tokens"]["fleet"][0] > 0
        assert charts["kv"]["dashw"][0] > 0
        assert charts["ttft"]["p50"][0] > 0 and charts["ttft"]["p99"][0] >= charts["ttft"]["p50"][0]
        assert charts["dead"]["all"][0] >= 1
        assert all(points >= 3 for series in charts.values() for _, points in series.values()), charts
        for k in range(24):
            assert collect(r, f"j{k}", timeout_s=120)[-1]["type"] == "done"
        shot = tmp_path / "dashboard.png"
        chromium(base + "/", f"--screenshot={shot}", "--window-size=1300,1100")
        assert shot.stat().st_size > 10_000
        time.sleep(1.5)  # a poll after the last job: the tenants table shows both tenants
        found = Series()
        found.feed(chromium(base + "/", "--dump-dom"))
        assert {"acme", "default"} <= set(found.tenant_cells)
        metrics = httpx.get(base + "/metrics").text
        assert f'conveyor_backlog_drain_seconds{{model="{model}"}}' in metrics
        assert f'conveyor_usage_completion_tokens_total{{model="{model}",tenant="acme"}} 360.0' in metrics
    finally:
        for proc in (dashboard, worker):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _busy(r) -> bool:
    records = registry.live(registry.read(r, Keys()))
    return any(x.running > 0 and x.kv_blocks_used > 0 and x.tokens_out_per_s > 0 for x in records)


def _job(job_id: str, max_tokens: int = 30) -> dict:
    return {"id": job_id, "prompt": "hello", "max_tokens": max_tokens, "ignore_eos": True}


@contextmanager
def backlog_kept(r, stream: str, low: int = 4, batch: int = 8):
    """While inside, a thread adds `batch` default-tenant jobs whenever the stream's lag falls below `low`.
    They are long (400 tokens), so the worker never idles between them: a record taken in a gap would show
    no jobs running and an empty KV pool, and the page polls for about a second only."""
    done = threading.Event()

    def top_up() -> None:
        n = 0
        while not done.wait(0.02):
            if max((g.get("lag") or 0 for g in r.xinfo_groups(stream)), default=0) < low:
                for _ in range(batch):
                    enqueue(r, _job(f"fill{n}", max_tokens=400))
                    n += 1

    thread = threading.Thread(target=top_up, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join(timeout=10)


def _get(url: str) -> bool:
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.HTTPError:
        return False
