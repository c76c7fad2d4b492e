"""The web dashboard: an ASGI (Starlette) app, standalone (`conveyor dashboard --port`) or mounted by the
gateway at /dashboard (`app.mount("/dashboard", dashboard_app(...))`).

    GET /               the page (static/index.html): uPlot charts, vendored in static/ (no CDN)
    GET /api/snapshot   one FleetSnapshot as JSON (worker/fleet/snapshot.py); the page polls it every second
    GET /metrics        the fleet's Prometheus metrics (worker/fleet/fleet_metrics.py)
    GET /static/...     the page's script, uPlot and its stylesheet

The page keeps the history it charts (it starts empty on each load). URLs in the page are built from the
mount point (ASGI root_path), so it works under any prefix.
"""

from __future__ import annotations

from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from worker.fleet.fleet_metrics import FleetCollector
from worker.fleet.read_fleet import take

STATIC = Path(__file__).parent / "static"


def dashboard_app(client, prefix: str = "conveyor", streams: tuple[str, ...] = ()) -> Starlette:
    """The dashboard over a synchronous redis-py client (redis.Redis or RedisCluster): the snapshot is
    read on Starlette's thread pool, so an async gateway's loop is not blocked by it."""

    def snapshot():
        return take(client, prefix, streams)

    registry = CollectorRegistry()
    registry.register(FleetCollector(snapshot))
    page = (STATIC / "index.html").read_text()

    async def index(request: Request) -> HTMLResponse:
        base = request.scope.get("root_path", "").rstrip("/")
        return HTMLResponse(page.replace("{{base}}", base))

    async def api_snapshot(request: Request) -> Response:
        snap = await run_in_threadpool(snapshot)
        return Response(snap.model_dump_json(), media_type="application/json")

    async def metrics(request: Request) -> Response:
        body = await run_in_threadpool(generate_latest, registry)
        return Response(body, media_type=CONTENT_TYPE_LATEST)

    return Starlette(
        routes=[
            Route("/", index),
            Route("/api/snapshot", api_snapshot),
            Route("/metrics", metrics),
            Mount("/static", StaticFiles(directory=STATIC), name="static"),
        ]
    )
