"""`GET /health`: 200 when Redis answers (no key needed: load balancers probe it), 503 when it does not or
when the stream hub's reader has stopped (no answer would ever come: restart the gateway);
`GET /metrics`: Prometheus text."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from worker.gateway.state import redis_of

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    reader = getattr(request.app.state, "hub_task", None)
    if reader is not None and reader.done():
        why = "cancelled" if reader.cancelled() else repr(reader.exception())
        return JSONResponse({"status": "unavailable", "stream_hub": f"stopped: {why}"}, status_code=503)
    try:
        await redis_of(request).ping()
    except Exception as exc:  # any failure to reach Redis is "not ready"
        return JSONResponse({"status": "unavailable", "redis": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok"})


@router.get("/metrics")
async def metrics() -> Response:
    """The process's Prometheus registry (worker/gateway/metrics.py), also without --metrics-port."""
    return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)
