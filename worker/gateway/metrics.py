"""The gateway's Prometheus metrics (served at /metrics and on --metrics-port): answers by path and
status, and requests in flight (streams included). Paths outside the API count as "other", so a scan of
random URLs cannot grow the label set."""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge

PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health")

ANSWERS = Counter("conveyor_gateway_requests_total", "HTTP answers", ["path", "status"])
IN_FLIGHT = Gauge("conveyor_gateway_requests_in_flight", "HTTP requests being answered (streams included)")


class Counted:
    """Pure ASGI: counts each answer's status when it starts, and what is in flight until it ends."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope["path"] if scope["path"] in PATHS else "other"

        async def counted(message) -> None:
            if message["type"] == "http.response.start":
                ANSWERS.labels(path, str(message["status"])).inc()
            await send(message)

        IN_FLIGHT.inc()
        try:
            await self.app(scope, receive, counted)
        finally:
            IN_FLIGHT.dec()
