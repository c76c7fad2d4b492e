"""`conveyor top` and `conveyor dashboard`: the fleet as Redis shows it (worker/fleet/)."""

from __future__ import annotations

import time
from typing import Any

import click

from worker.cli.main import _client, main, redis_options
from worker.cli.options import opt, pop_config_kwargs
from worker.keys import Keys


def _fleet_client(kw: dict, cluster: bool):
    keys = Keys(**pop_config_kwargs(Keys, kw, exclude=("dead_stream",)))
    return _client(kw, cluster=cluster), keys


@main.command("top")
@redis_options
@opt("--cluster", is_flag=True, help="--redis-url is a Redis Cluster node")
@opt("--once", is_flag=True, help="print one snapshot and exit")
@opt("--json", "as_json", is_flag=True, help="with --once: the snapshot as JSON (FleetSnapshot)")
@opt("--interval", type=click.FloatRange(min=0.1), default=1.0, help="seconds between refreshes")
def top(cluster: bool, once: bool, as_json: bool, interval: float, **kw: Any) -> None:
    """A live view of the fleet: backlog per model, workers, tenants, batches."""
    import redis
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from worker.fleet.read_fleet import take
    from worker.fleet.top_view import render

    client, keys = _fleet_client(kw, cluster)
    extra = (keys.requests,)
    if once:
        snap = take(client, keys.prefix, extra)
        if as_json:
            click.echo(snap.model_dump_json())
        else:
            Console().print(render(snap))
        return

    def frame():
        try:
            return render(take(client, keys.prefix, extra))
        except redis.RedisError as exc:  # Redis away: say so and keep trying
            return Text(f"cannot read the fleet from Redis: {exc}", style="bold red")

    with Live(frame(), auto_refresh=False, screen=False) as live:
        try:
            while True:
                time.sleep(interval)
                live.update(frame(), refresh=True)
        except KeyboardInterrupt:
            pass


@main.command("dashboard")
@redis_options
@opt("--cluster", is_flag=True, help="--redis-url is a Redis Cluster node")
@opt("--host", default="127.0.0.1", help="address to listen on")
@opt("--port", type=int, default=8088, help="port to listen on")
def dashboard(cluster: bool, host: str, port: int, **kw: Any) -> None:
    """The web dashboard (and the fleet's Prometheus gauges at /metrics), standalone."""
    import uvicorn

    from worker.fleet.dashboard.app import dashboard_app

    client, keys = _fleet_client(kw, cluster)
    uvicorn.run(
        dashboard_app(client, keys.prefix, (keys.requests,)), host=host, port=port, log_level="warning"
    )
