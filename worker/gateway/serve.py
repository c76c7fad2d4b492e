"""`conveyor serve`: the app under uvicorn, and a Prometheus listener of its own when --metrics-port is set.

Once the app is built, what start-up left on the heap (the modules, FastAPI's routes and models: ~80k
objects) is frozen out of the garbage collector's reach (gc.freeze). A full collection walks every object
it tracks, and every stream waits meanwhile: over this heap a collection takes tens of milliseconds,
during which no chunk is written. Frozen
objects are still freed by reference counting; only a reference cycle among them that becomes garbage
later is never reclaimed. vLLM's API server, SGLang and Ray Serve make the same trade.
"""

from __future__ import annotations

import gc

import uvicorn

from worker.gateway.app import create_app
from worker.gateway.settings import GatewaySettings


def run(settings: GatewaySettings, log_level: str = "info") -> None:
    if settings.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(settings.metrics_port, addr=settings.host)
    app = create_app(settings)
    freeze_startup_heap()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level.lower(),
        # No request line per request: the access log would cost more than the streamed tokens.
        access_log=False,
        timeout_graceful_shutdown=30,
    )


def freeze_startup_heap() -> None:
    """Collect what start-up left behind, then freeze the rest. Once per process, just before it serves
    (in a test process it would keep every later test's garbage cycles alive)."""
    gc.collect()
    gc.freeze()
