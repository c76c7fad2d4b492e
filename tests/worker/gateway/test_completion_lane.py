"""CompletionLane: a POST to either completion route goes to completions.complete without FastAPI's router
(with the API-key check, and OpenAI's error object for an APIError); every other request goes on to the
app it wraps. The routes' behaviour through a real gateway is tested in test_openai_sdk.py and the others."""

from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import pytest
from starlette.responses import JSONResponse

from worker.gateway import completion_lane
from worker.gateway.completion_lane import CompletionLane


def _call(lane, method: str, path: str, headers=(), root_path: str = "") -> tuple[int, dict | None]:
    settings = SimpleNamespace(api_keys={"k1": "tenant-a"})
    scope = {"type": "http", "method": method, "path": path, "root_path": root_path, "query_string": b"",
             "headers": [(k.encode(), v.encode()) for k, v in headers],
             "app": SimpleNamespace(state=SimpleNamespace(settings=settings))}  # fmt: skip
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    asyncio.run(lane(scope, receive, send))
    status = sent[0]["status"]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return status, json.loads(body) if body else None


@pytest.fixture
def lane(monkeypatch):
    seen = []

    async def complete(request, url: str, tenant):
        seen.append(("complete", url, tenant))
        return JSONResponse({"url": url})

    async def inner(scope, receive, send) -> None:
        seen.append(("app", scope["method"], scope["path"]))
        await JSONResponse({}, status_code=405)(scope, receive, send)

    monkeypatch.setattr(completion_lane, "complete", complete)
    return CompletionLane(inner), seen


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_a_completion_post_goes_to_complete_with_its_tenant(lane, path):
    app, seen = lane
    assert _call(app, "POST", path, [("authorization", "Bearer k1")]) == (200, {"url": path})
    assert seen == [("complete", path, "tenant-a")]


@pytest.mark.parametrize(
    "method, path, root_path",
    [
        ("GET", "/v1/completions", ""),
        ("POST", "/v1/completions/", ""),
        ("POST", "/v1/models", ""),
        ("POST", "/v1/completions", "/api"),
    ],
)
def test_anything_else_goes_on_to_the_app(lane, method, path, root_path):
    app, seen = lane
    assert _call(app, method, path, [("authorization", "Bearer k1")], root_path)[0] == 405
    assert seen == [("app", method, path)]


def test_a_bad_key_is_a_401_with_openai_error_object(lane):
    app, seen = lane
    status, body = _call(app, "POST", "/v1/completions", [("authorization", "Bearer nope")])
    assert status == 401 and body["error"]["message"] == "incorrect API key"
    assert seen == []


def test_the_gateway_answers_completions_in_the_lane_inside_its_body_limit():
    from worker.gateway.app import create_app
    from worker.gateway.body_limit import BodyLimit
    from worker.gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(redis_url="redis://127.0.0.1:1/0"))
    order = [m.cls for m in app.user_middleware]  # outermost first
    assert order.index(BodyLimit) < order.index(CompletionLane) == len(order) - 1
