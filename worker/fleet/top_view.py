"""`conveyor top`'s screen: a FleetSnapshot (worker/fleet/snapshot.py) as rich tables."""

from __future__ import annotations

from rich.console import Group
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from worker.fleet.snapshot import FleetSnapshot


def render(snap: FleetSnapshot) -> Group:
    return Group(_models(snap), _streams(snap), _workers(snap), _tenants(snap), _batches(snap))


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 3600:
        return f"{value / 3600:.1f}h"
    return f"{value / 60:.1f}m" if value >= 60 else f"{value:.1f}s"


def _models(snap: FleetSnapshot) -> Table:
    ttft = f"TTFT p50 {_seconds(snap.ttft_p50_s)} p99 {_seconds(snap.ttft_p99_s)}"
    t = Table(
        title=f"models  ·  {snap.tokens_per_s:.0f} tok/s  ·  {ttft}  ·  dead (1h) {snap.dead_last_hour}",
        title_justify="left",
    )
    for column in ("model", "backlog", "est. tokens", "pending", "oldest wait", "workers", "jobs/s"):
        t.add_column(column, justify="left" if column == "model" else "right")
    for column in ("tok/s", "drain", "dead (1h)"):
        t.add_column(column, justify="right")
    for m in snap.models:
        t.add_row(
            m.model,
            str(m.backlog),
            "-" if m.backlog_tokens is None else str(m.backlog_tokens),
            str(m.pending),
            _seconds(m.oldest_wait_s),
            str(m.workers),
            f"{m.jobs_per_s:.1f}",
            f"{m.tokens_out_per_s:.0f}",
            _seconds(m.drain_s),
            str(m.dead_last_hour),
        )
    return t


def _streams(snap: FleetSnapshot) -> Table:
    t = Table(title="request streams with a backlog", title_justify="left")
    for column in ("stream", "backlog", "readers", ""):
        t.add_column(column, justify="right" if column in ("backlog", "readers") else "left")
    for s in snap.streams:
        flag = Text("NO LIVE WORKER READS IT", style="bold red") if s.unread else Text("")
        t.add_row(s.stream, str(s.backlog), str(s.readers), flag)
    return t


def _workers(snap: FleetSnapshot) -> Table:
    t = Table(title="workers", title_justify="left")
    for column in ("worker", "model", "state", "running", "waiting", "KV use", "tok/s", "heartbeat"):
        t.add_column(column, justify="left" if column in ("worker", "model", "state") else "right")
    for w in snap.workers:
        state = Text("LOST", style="bold red") if w.lost else Text("draining" if w.draining else "live")
        t.add_row(
            w.consumer,
            w.model or "-",
            state,
            str(w.running),
            str(w.waiting),
            "-" if w.lost else f"{w.kv_use:.0%} ({w.kv_blocks_used}/{w.kv_blocks_total})",
            f"{w.tokens_per_s:.0f}",
            f"{w.heartbeat_age_s:.1f}s ago",
        )
    return t


def _tenants(snap: FleetSnapshot) -> Table:
    t = Table(title="tenants (since the counters began)", title_justify="left")
    for column in ("tenant", "model", "jobs", "prompt tokens", "completion tokens", "engine-s"):
        t.add_column(column, justify="left" if column in ("tenant", "model") else "right")
    for u in snap.tenants:
        t.add_row(
            u.tenant,
            u.model,
            str(u.jobs),
            str(u.prompt_tokens),
            str(u.completion_tokens),
            f"{u.engine_seconds:.2f}",
        )
    return t


def _batches(snap: FleetSnapshot) -> Table:
    t = Table(title="batches in progress", title_justify="left")
    for column in ("batch", "progress", "done", "failed", "total"):
        t.add_column(column, justify="left" if column in ("batch", "progress") else "right")
    for b in snap.batches:
        bar = ProgressBar(total=max(b.total, 1), completed=b.done + b.failed, width=30)
        t.add_row(b.id, bar, str(b.done), str(b.failed), str(b.total))
    return t
