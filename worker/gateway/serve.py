"""`conveyor serve`: the app under uvicorn, and a Prometheus listener of its own when --metrics-port is set."""

from __future__ import annotations

import uvicorn

from worker.gateway.app import create_app
from worker.gateway.settings import GatewaySettings


def run(settings: GatewaySettings, log_level: str = "info") -> None:
    if settings.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, addr=settings.host)
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        # No request line per request: the access log would cost more than the streamed tokens.
        access_log=False,
        timeout_graceful_shutdown=30,
    )
