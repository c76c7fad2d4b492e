"""The gateway's frame: settings and API keys, OpenAI error objects, the body limit, /health against a real Redis."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from worker.gateway.app import create_app
from worker.gateway.settings import GatewaySettings, parse_api_keys


def test_api_keys_name_their_tenant_or_default():
    assert parse_api_keys(["k1", "acme=k2,beta=k3", " "]) == {"k1": "default", "k2": "acme", "k3": "beta"}
    with pytest.raises(ValueError):
        parse_api_keys(["a=k", "b=k"])
    with pytest.raises(ValueError):
        GatewaySettings(api_keys={"k": "not a tenant"})


@pytest.mark.redis
def test_health_answers_and_unknown_paths_are_openai_errors(redis_server):
    with TestClient(create_app(GatewaySettings(redis_url=redis_server.url))) as http:
        assert http.get("/health").json() == {"status": "ok"}
        missing = http.get("/v1/nothing-here")
        assert missing.status_code == 404
        assert set(missing.json()["error"]) == {"message", "type", "param", "code"}
        metrics = http.get("/metrics").text
        assert 'conveyor_gateway_requests_total{path="other",status="404"}' in metrics
        assert 'conveyor_gateway_requests_total{path="/health",status="200"}' in metrics


def test_health_is_503_without_redis():
    from worker.local_redis import free_port

    settings = GatewaySettings(redis_url=f"redis://127.0.0.1:{free_port()}/0", redis_socket_timeout=1)
    with TestClient(create_app(settings)) as http:
        assert http.get("/health").status_code == 503


def test_a_body_over_the_limit_is_413_before_any_route_reads_it():
    settings = GatewaySettings(redis_url="redis://127.0.0.1:1/0", max_body_bytes=1024)
    with TestClient(create_app(settings)) as http:
        answer = http.post("/v1/chat/completions", content=b"x" * 2048)
        assert answer.status_code == 413 and answer.json()["error"]["code"] == "payload_too_large"

        def chunks():  # no Content-Length: counted while the route reads it
            yield b"x" * 1000
            yield b"x" * 1000

        chunked = http.post("/v1/completions", content=chunks())
        assert chunked.status_code == 413 and chunked.json()["error"]["code"] == "payload_too_large"


def test_a_new_redis_connection_does_not_look_up_redis_pys_version(monkeypatch):
    # A burst of requests opens a burst of connections; each looked the version up in the package
    # metadata (redis-py's default), on the event loop.
    import redis.utils

    from worker.gateway.redis_client import connect_async

    def looked_up() -> str:
        raise AssertionError("redis-py's version was looked up for a connection")

    client = connect_async(GatewaySettings(redis_url="redis://127.0.0.1:1/0"))  # may look it up once
    monkeypatch.setattr(redis.utils, "get_lib_version", looked_up)
    for _ in range(2):
        assert client.connection_pool.make_connection() is not None


def test_the_api_key_check_runs_on_the_event_loop(monkeypatch):
    # A plain `def` dependency runs on FastAPI's thread pool, a hand-off per request; the key check awaits
    # nothing, so it runs on the loop: with the pool unusable, requests are still answered.
    import fastapi.dependencies.utils as dependency_utils

    async def no_pool(*args, **kwargs):
        raise AssertionError("a dependency ran on the thread pool")

    settings = GatewaySettings(redis_url="redis://127.0.0.1:1/0", api_keys={"sk-1": "acme"})
    with TestClient(create_app(settings)) as http:
        monkeypatch.setattr(dependency_utils, "run_in_threadpool", no_pool)
        assert http.get("/v1/models").status_code == 401  # refused by the check, before any Redis read
