"""The real `openai` package against `conveyor serve` and a real worker (tiny model): the text is the
engine's own greedy text, sync, async and streamed; models, X-Request-Id, JSON schema, curl -N."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess

import openai
import pytest

from tests.helpers.gateway import greedy
from tests.worker.gateway.conftest import KEY, MODEL, TENANT

pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]
CHAT = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a colour."}]


def test_models_list_shows_the_served_model(sdk):
    models = sdk.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert sdk.models.retrieve(MODEL).id == MODEL


def test_chat_sync_async_and_streamed_equal_the_engines_greedy_text(sdk, served, tiny_model):
    want = greedy(tiny_model, CHAT, 12)
    answer = sdk.chat.completions.create(model=MODEL, messages=CHAT, max_tokens=12, temperature=0)
    assert answer.choices[0].message.content == want
    assert answer.usage.completion_tokens == 12 and answer.choices[0].finish_reason == "length"

    async def async_call() -> str:
        client = openai.AsyncOpenAI(base_url=served[1].base_url, api_key=KEY, max_retries=0)
        async with client:
            got = await client.chat.completions.create(
                model=MODEL, messages=CHAT, max_completion_tokens=12, temperature=0
            )
        return got.choices[0].message.content

    assert asyncio.run(async_call()) == want
    pieces, usage, finish = [], None, None
    for chunk in sdk.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ):
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            pieces.append(choice.delta.content or "")
            finish = choice.finish_reason or finish
    assert "".join(pieces) == want and finish == "length"
    assert usage is not None and usage.completion_tokens == 12


def test_completions_equal_the_engines_greedy_text(sdk, tiny_model):
    want = greedy(tiny_model, "Once upon a time", 10)
    got = sdk.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0)
    assert got.choices[0].text == want
    streamed = sdk.completions.create(
        model=MODEL, prompt="Once upon a time", max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want


def test_json_schema_response_format_gives_valid_json(sdk):
    import jsonschema

    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
        "required": ["name", "ok"],
        "additionalProperties": False,
    }
    answer = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "A person as JSON"}],
        max_tokens=60,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
    )
    assert answer.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(answer.choices[0].message.content), schema)


def test_a_valid_request_id_is_the_job_id_under_the_tenant(sdk, served):
    import redis

    raw = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=3, extra_headers={"X-Request-Id": "my-req.1"}
    )
    assert raw.headers["x-request-id"] == f"{TENANT}:my-req.1"
    client = redis.Redis.from_url(served[0])
    events = [json.loads(f[b"event"]) for _, f in client.xrange(f"conveyor:out:{TENANT}:my-req.1")]
    assert events[-1]["type"] == "done" and raw.parse().choices[0].message.content == events[-1]["text"]
    bad = sdk.chat.completions.with_raw_response.create(
        model=MODEL, messages=CHAT, max_tokens=3, extra_headers={"X-Request-Id": "no spaces"}
    )
    assert bad.headers["x-request-id"] != f"{TENANT}:no spaces" and len(bad.headers["x-request-id"]) == 32


def test_curl_reads_the_sse_stream(served, tiny_model):
    assert shutil.which("curl"), "curl is not installed"
    body = {"model": MODEL, "messages": CHAT, "max_tokens": 8, "temperature": 0, "stream": True}
    done = subprocess.run(
        ["curl", "-sN", f"{served[1].base_url}/chat/completions", "-H", f"Authorization: Bearer {KEY}",
         "-H", "Content-Type: application/json", "-d", json.dumps(body)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    events = [line[len("data: ") :] for line in done.stdout.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and all(line.strip() for line in done.stdout.split("\n\n")[:-1])
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert text == greedy(tiny_model, CHAT, 8)


def test_a_client_that_leaves_mid_stream_cancels_its_job(served):
    import socket

    import redis

    from tests.helpers.paused import paused
    from tests.helpers.rel_helpers import K, read_events, terminal
    from tests.helpers.waiting import wait_until

    body = json.dumps(
        {
            "model": MODEL,
            "messages": CHAT,
            "max_tokens": 1500,
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {KEY}\r\n"
        f"X-Request-Id: leaver\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    # A plain socket, closed by this test once the stream has begun, while the worker is frozen: the client
    # leaves at a known moment, and the job cannot have run to max_tokens before the gateway's cancel reaches
    # Redis, however fast the worker is. (A token event's text can be empty, a character's bytes split
    # between tokens, and the gateway sends no chunk for it: hence 16 events for two chunks.)
    client = redis.Redis.from_url(served[0])
    job_id = f"{TENANT}:leaver"
    with socket.create_connection(("127.0.0.1", served[1].port), timeout=30) as sock:
        sock.sendall(head.encode() + body)
        wait_until(lambda: len(read_events(client, job_id)) >= 16, 60, "16 events of the job", 0.002)
        with paused(served[2].process.pid):
            assert terminal(read_events(client, job_id)) is None
            got = b""
            while got.count(b"data: ") < 2:
                got += sock.recv(65536)
            sock.close()
            wait_until(lambda: client.exists(K.cancel(job_id)), 30, "the gateway to cancel the job")
    end = wait_until(lambda: terminal(read_events(client, job_id)), 60, "the job to end")
    logs = [line for path in served[1].log.parent.glob("*.log") for line in path.read_text().splitlines()]
    why = "\n".join(
        [str(end["usage"]), str(end["timing"])] + [line[:300] for line in logs if "leaver" in line]
    )
    assert (end["type"], end["finish_reason"], end.get("reason")) == ("done", "abort", "cancel"), why
    assert end["usage"]["completion_tokens"] < 1500


def test_the_node_example_streams_with_the_js_openai_package(served, tiny_model):
    import os
    from pathlib import Path

    # A missing tool or a failed `npm ci` (the npm registry is reachable where the tests run) fails.
    assert shutil.which("node") and shutil.which("npm"), "node and npm are not installed"
    example = Path(__file__).resolve().parents[3] / "examples" / "openai-node"
    if not (example / "node_modules" / "openai").exists():
        ci = subprocess.run(
            ["npm", "ci", "--no-audit", "--no-fund"], cwd=example, capture_output=True, text=True, timeout=180
        )
        assert ci.returncode == 0, f"npm ci failed: {ci.stderr[-600:]}"
    env = {**os.environ, "OPENAI_BASE_URL": served[1].base_url, "OPENAI_API_KEY": KEY, "MODEL": MODEL}
    done = subprocess.run(
        ["node", "chat.js", "Hello from Node", "12"],
        cwd=example,
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    want = greedy(tiny_model, [{"role": "user", "content": "Hello from Node"}], 12)
    assert done.stdout == want + "\n[done: length, 12 tokens]\n"
