"""`create_app(settings) -> FastAPI`: the gateway's routes, error handlers, body limit and Redis client.

Routers other parts add (the Batch API) are included here, and the fleet dashboard is mounted at /dashboard. Background tasks that must run
while the app serves (a batch driver) go in `app.state.starters`: each is `async def start(app)`, run as a
task from start-up and cancelled at shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from worker.fleet.dashboard.app import dashboard_app
from worker.gateway import batch_api, completions, errors, health, models
from worker.gateway.body_limit import BodyLimit
from worker.gateway.completion_lane import CompletionLane
from worker.gateway.fleet_view import FleetView
from worker.gateway.metrics import Counted
from worker.gateway.own_reads import OwnReads
from worker.gateway.redis_client import connect_async
from worker.gateway.settings import GatewaySettings
from worker.gateway.stream_hub import StreamHub
from worker.gateway.xadd_batch import XaddBatch
from worker.keys import Keys


def create_app(settings: GatewaySettings, client=None) -> FastAPI:
    """`client`: a `redis.asyncio` client to use instead of one made from the settings (closed by the caller)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = client if client is not None else connect_async(settings)
        app.state.fleet = FleetView(app.state.redis, app.state.keys)
        app.state.xadds = XaddBatch(app.state.redis)  # the jobs of one turn of the loop: one round trip
        tasks = [asyncio.create_task(start(app)) for start in app.state.starters]
        app.state.hub_task = None  # /health fails once it has ended (worker/gateway/health.py)
        hub = None
        if settings.cluster:  # a multi-key XREAD stays in one slot: each request reads its own stream
            app.state.hub = OwnReads(app.state.redis, settings.block_ms)
        else:  # one reader for every output stream
            hub = app.state.hub = StreamHub(app.state.redis, app.state.keys, settings.block_ms)
            app.state.hub_task = asyncio.create_task(hub.run())
            tasks.append(app.state.hub_task)
        try:
            yield
        finally:
            if hub is not None:
                hub.close()  # in case the cancel below is lost
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if client is None:
                await app.state.redis.aclose()

    app = FastAPI(title="Conveyor", lifespan=lifespan, docs_url=None, redoc_url=None)
    app.state.settings = settings
    app.state.keys = Keys(prefix=settings.prefix)
    app.state.starters = []
    errors.install(app)
    # Uploads to /v1/files have a limit of their own: the file's (--max-file-bytes, checked exactly by the
    # route) plus room for the multipart framing and the other form fields.
    uploads = {"/v1/files": settings.batches.max_file_bytes + 64 * 1024}
    app.add_middleware(CompletionLane)  # innermost of these: inside the body limit and the metrics
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, paths=uploads)
    app.add_middleware(Counted)
    app.include_router(health.router)
    app.include_router(models.router)
    app.include_router(completions.router)
    batch_api.install(app, settings)
    # The fleet dashboard (worker/fleet/dashboard/), read with the Batch API's synchronous client.
    app.mount("/dashboard", dashboard_app(app.state.batch_api.client, settings.prefix))
    return app
