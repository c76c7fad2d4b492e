"""What a route reads from the app: its settings, Redis client and key names (set by app.create_app)."""

from __future__ import annotations

from fastapi import Request

from worker.gateway.settings import GatewaySettings
from worker.keys import Keys


def settings_of(request: Request) -> GatewaySettings:
    return request.app.state.settings


def redis_of(request: Request):
    """The app's `redis.asyncio` client (bytes replies, RESP2), or its RedisCluster in cluster mode."""
    return request.app.state.redis


def keys_of(request: Request) -> Keys:
    return request.app.state.keys
