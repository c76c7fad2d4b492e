"""`create_app(settings) -> FastAPI`: the gateway's routes, error handlers, body limit and Redis client.

Routers other parts add (the Batch API, the dashboard) are included here. Background tasks that must run
while the app serves (a batch driver) go in `app.state.starters`: each is `async def start(app)`, run as a
task from start-up and cancelled at shutdown.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from prometheus_client import make_asgi_app

from worker.gateway import batch_api, errors, health
from worker.gateway.body_limit import BodyLimit
from worker.gateway.redis_client import connect_async
from worker.gateway.settings import GatewaySettings
from worker.keys import Keys


def create_app(settings: GatewaySettings, client=None) -> FastAPI:
    """`client`: a `redis.asyncio` client to use instead of one made from the settings (closed by the caller)."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.redis = client if client is not None else connect_async(settings)
        tasks = [asyncio.create_task(start(app)) for start in app.state.starters]
        try:
            yield
        finally:
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
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes, paths=uploads)
    app.include_router(health.router)
    batch_api.install(app, settings)
    app.mount("/metrics", make_asgi_app())  # the process's Prometheus registry (worker/gateway/metrics.py)
    return app
