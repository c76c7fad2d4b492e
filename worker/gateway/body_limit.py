"""413 for a request body over the limit, decided from Content-Length when given and while the body is read
otherwise (chunked uploads), before any route parses it. Pure ASGI, so streamed responses are untouched."""

from __future__ import annotations

from typing import Any

from worker.gateway.errors import too_large


class BodyLimit:
    def __init__(self, app: Any, max_bytes: int, paths: dict[str, int] | None = None) -> None:
        """`paths`: a path -> its own limit (uploads, larger than any JSON body)."""
        self.app, self.max_bytes, self.paths = app, max_bytes, paths or {}

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.paths.get(scope["path"].rstrip("/"), self.max_bytes)
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and length.isdigit() and int(length) > limit:
            await too_large(limit).response()(scope, receive, send)
            return
        seen = 0

        async def counted():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise _TooLarge
            return message

        try:
            await self.app(scope, counted, send)
        except _TooLarge:
            await too_large(limit).response()(scope, receive, send)


class _TooLarge(Exception):
    pass
