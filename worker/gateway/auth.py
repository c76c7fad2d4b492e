"""API keys: `Authorization: Bearer <key>` -> the key's tenant, the dependency every /v1 route uses."""

from __future__ import annotations

import hmac

from fastapi import Request

from worker.gateway.errors import unauthorized
from worker.gateway.state import settings_of


async def tenant_of(request: Request) -> str | None:
    """The tenant of the request's key; None when the gateway asks for no key. 401 for a missing or
    unknown key. Every configured key is compared in constant time, so timing tells nothing about them.
    Async though it awaits nothing: FastAPI runs a plain `def` dependency on its thread pool, a hand-off
    to a thread and back for every request, where this is a few comparisons."""
    keys = settings_of(request).api_keys
    if not keys:
        return None
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        raise unauthorized("missing API key: send `Authorization: Bearer <key>`")
    found = None
    for key, tenant in keys.items():
        if hmac.compare_digest(key.encode(), given.strip().encode()):
            found = tenant
    if found is None:
        raise unauthorized("incorrect API key")
    return found
