"""A worker killed with SIGKILL mid-stream is invisible to the HTTP client: the second worker takes the job
over and the gateway goes on reading the same output stream, so the text equals an uninterrupted run."""

from __future__ import annotations

import openai
import pytest
import redis

from tests.helpers.gateway import greedy, spawn_gateway
from tests.helpers.rel_helpers import Workers
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
ASK = [{"role": "user", "content": "Tell me a long story."}]


def test_kill9_of_the_streaming_worker_mid_stream(redis_server, tiny_model, tmp_path):
    workers = Workers(tiny_model, tmp_path)
    spawned = {
        name: workers.spawn(redis_server.url, name, "--served-model-name", "tiny", group="tiny")
        for name in ("tk1", "tk2")
    }
    gateway = spawn_gateway(redis_server.url, tmp_path)
    try:
        for w in spawned.values():
            w.wait_started()
        sdk = openai.OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=120)
        client = redis.Redis.from_url(redis_server.url)
        stream = sdk.chat.completions.create(
            model="tiny",
            messages=ASK,
            max_tokens=400,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
            extra_headers={"X-Request-Id": "survivor"},
        )
        pieces, killed = [], None
        for chunk in stream:
            pieces.extend(c.delta.content or "" for c in chunk.choices)
            if killed is None and len(pieces) >= 6:
                killed = client.get(Keys().owner("survivor")).decode()
                spawned[killed].kill9()
        assert killed is not None, "the stream ended before a worker could be killed"
        assert "".join(pieces) == greedy(tiny_model, ASK, 400, ignore_eos=True)
        survivor = next(w for name, w in spawned.items() if name != killed)
        resumed = survivor.logged("job runs alone: an earlier attempt did not finish")
        assert [e["request_id"] for e in resumed] == ["survivor"]  # it was the survivor that finished it
    finally:
        gateway.stop()
        workers.stop_all()
