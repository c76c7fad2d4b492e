"""What a hostile client or a hostile stream entry does to one `conveyor serve` process, with a real
redis-server: the test serves the model itself (tests/helpers/scripted_model.py), writing each job's events
as a worker would, and the entries no worker writes. Nothing one body or one output stream holds may stall
the gateway or any other request on it; a body it refuses is OpenAI's error object with 400."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.helpers.gateway import spawn_gateway
from tests.helpers.scripted_model import ScriptedModel, done, token
from tests.helpers.waiting import wait_until
from worker.keys import JOB_FIELD
from worker.strict_json import MAX_JSON_DEPTH

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
ASK = [{"role": "user", "content": "Hello"}]
DEEP = b"[" * 5000 + b"]" * 5000


@pytest.fixture(scope="module")
def gateway(redis_server, tmp_path_factory):
    gateway = spawn_gateway(redis_server.url, tmp_path_factory.mktemp("hostile"), "--request-timeout", "60")
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def model(redis_server):
    model = ScriptedModel(redis_server.url)
    yield model
    model.close()


def _body(model: ScriptedModel, stream: bool = False) -> dict:
    return {"model": model.name, "messages": ASK, "max_tokens": 4, "stream": stream}


def _post(gateway, body: dict | bytes, request_id: str | None = None) -> httpx.Response:
    headers = {"x-request-id": request_id} if request_id else {}
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    headers["content-type"] = "application/json"
    return httpx.post(f"{gateway.base_url}/chat/completions", content=content, headers=headers, timeout=20)


def _streamed(gateway, body: dict, request_id: str) -> tuple[int, list[str]]:
    """The status and the `data:` payloads of a streamed answer."""
    url = f"{gateway.base_url}/chat/completions"
    with httpx.stream("POST", url, json=body, headers={"x-request-id": request_id}, timeout=20) as answer:
        text = answer.read().decode()
    return answer.status_code, [line[6:] for line in text.splitlines() if line.startswith("data: ")]


def _assert_refused(answer: httpx.Response, *words: str) -> None:
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error"
    for word in words:
        assert word in error["message"], error


def test_a_poisoned_output_stream_ends_only_its_own_answer(gateway, model):
    """One entry nested 5000 deep in one live stream: that answer ends (an error chunk after its first
    token, or a 500), the innocent stream beside it is answered, later requests are answered too, and
    /health stays 200."""
    with ThreadPoolExecutor(3) as pool:
        poisoned_stream = pool.submit(_streamed, gateway, _body(model, stream=True), "poison-s")
        poisoned_plain = pool.submit(_post, gateway, _body(model), "poison-p")
        innocent = pool.submit(_streamed, gateway, _body(model, stream=True), "innocent")
        model.wait_jobs("poison-s", "poison-p", "innocent")
        model.emit("poison-s", token(0, "x"))
        model.emit("innocent", token(0, "a"))
        model.emit_raw("poison-s", DEEP)
        model.emit_raw("poison-p", DEEP)
        model.emit("innocent", token(1, "b"), done("ab"))
        status, chunks = poisoned_stream.result(timeout=30)
        assert status == 200 and chunks[-1] == "[DONE]"
        assert json.loads(chunks[-2])["error"]["code"] == "internal_error"
        plain = poisoned_plain.result(timeout=30)
        assert plain.status_code == 500 and plain.json()["error"]["code"] == "internal_error"
        status, chunks = innocent.result(timeout=30)
        assert status == 200 and chunks[-1] == "[DONE]"
        text = "".join(
            c["delta"].get("content") or "" for x in chunks[:-1] for c in json.loads(x).get("choices", [])
        )
        assert text == "ab"
    with ThreadPoolExecutor(1) as pool:
        later = pool.submit(_post, gateway, _body(model), "after-poison")
        model.wait_jobs("after-poison")
        model.emit("after-poison", token(0, "c"), done("c"))
        answer = later.result(timeout=30)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "c"
    assert httpx.get(f"http://127.0.0.1:{gateway.port}/health", timeout=5).status_code == 200


def _sent(model: ScriptedModel, request_id: str, times: int) -> None:
    """Wait until `times` requests have added the job `request_id`."""
    wait_until(
        lambda: (
            sum(json.loads(f[JOB_FIELD])["id"] == request_id for _, f in model.r.xrange(model.stream))
            >= times
        ),
        30,
        f"{times} jobs {request_id}",
        0.02,
    )


@pytest.mark.parametrize("second", ["plain", "streamed"])
def test_the_same_request_id_twice_at_once_answers_both_from_the_one_job(gateway, model, second):
    rid = f"twice-{second}"
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(_post, gateway, _body(model), rid)
        _sent(model, rid, 1)
        if second == "plain":
            other = pool.submit(_post, gateway, _body(model), rid)
        else:
            other = pool.submit(_streamed, gateway, _body(model, stream=True), rid)
        _sent(model, rid, 2)  # a worker would run the first and acknowledge the second as a duplicate
        model.emit(rid, token(0, "h"), token(1, "i"), done("hi"))
        answer = first.result(timeout=30)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "hi"
        if second == "plain":
            again = other.result(timeout=30)
            assert again.status_code == 200 and again.json()["choices"][0]["message"]["content"] == "hi"
        else:
            status, chunks = other.result(timeout=30)
            assert status == 200 and chunks[-1] == "[DONE]"


def _leave_after_first_chunk(gateway, body: dict, request_id: str) -> None:
    url = f"{gateway.base_url}/chat/completions"
    with httpx.stream("POST", url, json=body, headers={"x-request-id": request_id}, timeout=20) as answer:
        next(answer.iter_lines())


def test_one_of_two_requests_with_one_id_leaving_does_not_cancel_the_others_job(gateway, model):
    rid = "twice-one-leaves"
    with ThreadPoolExecutor(2) as pool:
        staying = pool.submit(_post, gateway, _body(model), rid)
        _sent(model, rid, 1)
        leaving = pool.submit(_leave_after_first_chunk, gateway, _body(model, stream=True), rid)
        _sent(model, rid, 2)
        model.emit(rid, token(0, "h"))
        leaving.result(timeout=30)
        time.sleep(0.5)  # the gateway sees the disconnect (it would cancel the job here)
        model.emit(rid, done("h"))
        answer = staying.result(timeout=30)
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"] == "h"
    assert not model.r.exists(model.keys.cancel(rid))


def test_a_body_nested_100000_deep_is_a_400(gateway, model):
    nested = b'{"model": "scripted", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    _assert_refused(_post(gateway, nested), f"deeper than {MAX_JSON_DEPTH}")
    # A body nested within the limit is taken (metadata is accepted and ignored).
    within = {**_body(model), "metadata": {"x": json.loads("[" * 30 + "]" * 30)}}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, gateway, within, "nested-30")
        model.wait_jobs("nested-30")
        model.emit("nested-30", done("x"))
        assert answer.result(timeout=30).status_code == 200


def test_a_key_given_twice_is_a_400(gateway, model):
    twice = b'{"model": "scripted", "model": "other", "messages": [{"role": "user", "content": "x"}]}'
    _assert_refused(_post(gateway, twice), "duplicate key 'model'")
    deep_twice = b'{"model": "scripted", "messages": [{"role": "user", "role": "system", "content": "x"}]}'
    _assert_refused(_post(gateway, deep_twice), "duplicate key 'role'")


def test_a_lone_surrogate_is_refused_naming_where_it_is_in_the_body(gateway, model):
    body = b'{"model": "scripted", "messages": [{"role": "user", "content": "a\\ud800b"}]}'
    answer = _post(gateway, body)
    _assert_refused(answer, "messages.0.content", "surrogate")
    assert "column" not in answer.json()["error"]["message"]
    paired = (
        b'{"model": "scripted", "max_tokens": 1, "messages": [{"role": "user", "content": "\\ud83d\\ude00"}]}'
    )
    with ThreadPoolExecutor(1) as pool:
        fine = pool.submit(_post, gateway, paired, "paired-surrogates")
        assert (
            model.wait_jobs("paired-surrogates")["paired-surrogates"]["messages"][0]["content"]
            == "\U0001f600"
        )
        model.emit("paired-surrogates", done("x"))
        assert fine.result(timeout=30).status_code == 200


@pytest.mark.parametrize("role", ["wizard", "System", ""])
def test_an_unknown_chat_role_is_a_400(gateway, model, role):
    body = {**_body(model), "messages": [{"role": role, "content": "obey"}]}
    _assert_refused(_post(gateway, body), "messages.0.role")


def test_openais_roles_are_taken_and_developer_is_given_as_system(gateway, model):
    roles = ["system", "developer", "user", "assistant", "tool", "user"]
    body = {**_body(model), "messages": [{"role": r, "content": r} for r in roles]}
    with ThreadPoolExecutor(1) as pool:
        answer = pool.submit(_post, gateway, body, "all-roles")
        job = model.wait_jobs("all-roles")["all-roles"]
        model.emit("all-roles", done("x"))
        assert answer.result(timeout=30).status_code == 200
    assert [m["role"] for m in job["messages"]] == ["system", "system", "user", "assistant", "tool", "user"]


class _BrokenReads:
    """Stands in for the hub's Redis client: its XREAD fails as no Redis reply can make it fail."""

    async def xread(self, *args, **kwargs):
        raise RuntimeError("the reader breaks")


def test_a_gateway_whose_stream_hub_stopped_fails_health_and_answers_500_at_once(redis_server, model):
    from fastapi.testclient import TestClient

    from worker.gateway.app import create_app
    from worker.gateway.settings import GatewaySettings

    app = create_app(GatewaySettings(redis_url=redis_server.url, request_timeout_s=60))
    with TestClient(app) as http:
        assert http.get("/health").status_code == 200
        app.state.hub.client = _BrokenReads()  # the requests' own client (their XADDs) stays as it was
        started = time.monotonic()
        answer = http.post("/v1/chat/completions", json=_body(model))
        assert answer.status_code == 500 and answer.json()["error"]["code"] == "internal_error"
        assert time.monotonic() - started < 10  # not at the request's timeout
        health = http.get("/health")
        assert health.status_code == 503 and "stream_hub" in health.json()
        again = http.post("/v1/chat/completions", json=_body(model))
        assert again.status_code == 500
