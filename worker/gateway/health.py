"""`GET /health`: 200 when Redis answers (no key needed: load balancers probe it), 503 when it does not."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from worker.gateway.state import redis_of

router = APIRouter()


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    try:
        await redis_of(request).ping()
    except Exception as exc:  # any failure to reach Redis is "not ready"
        return JSONResponse({"status": "unavailable", "redis": str(exc)}, status_code=503)
    return JSONResponse({"status": "ok"})
