"""The two completion routes, answered without FastAPI's router: pure ASGI, inside the gateway's own
middleware (metrics, body limit) and outside FastAPI's exception middleware.

Every other request is matched against each route FastAPI knows, then passes its exception middleware,
its endpoint wrappers and its dependency solver. For a completion request that was a large part of the
gateway's CPU spent taking it in (a py-spy profile of 256 streaming requests), time during which no
other stream's chunk is written. Here the request costs a dict lookup, the API-key check and the route's
own work, with OpenAI's error object for an APIError as errors.install answers it in FastAPI.

The routes stay declared in completions.py, so a method other than POST and a path with a trailing slash
are answered by FastAPI as before (405, a redirect), and /openapi.json still lists them. Both ways
end in completions.complete.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from worker.gateway.auth import tenant_of
from worker.gateway.completions import complete
from worker.gateway.errors import APIError
from worker.openai.request import CHAT_URL, COMPLETIONS_URL

ROUTES = (CHAT_URL, COMPLETIONS_URL)  # the paths, which are also the Batch API's `url` of each


class CompletionLane:
    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        # Mounted under a root path (not by `conveyor serve`), FastAPI's matching applies.
        url = scope["path"] if scope["type"] == "http" and not scope.get("root_path") else None
        if url not in ROUTES or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        request = Request(scope, receive, send)
        try:
            response = await complete(request, url, await tenant_of(request))
        except APIError as exc:
            response = exc.response()
        await response(scope, receive, send)
