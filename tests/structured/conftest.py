"""An engine on the tiny random model, shared by a module (each engine starts one grammar compile process)."""

from __future__ import annotations

import pytest
import xgrammar  # noqa: F401  (the structured extra, in the test extra: missing, the folder fails to collect)


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    from engine import LLMEngine

    engine = LLMEngine(
        str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=16, dtype="float32", device="cpu"
    )
    yield engine
    engine.structured.close()


@pytest.fixture
def r(redis_server):
    import redis

    # redis-py 8 times sockets out after 5 s by default, as long as worker.client's XREAD blocks; the first
    # constrained job waits for the grammar compile process to start, which can take that long.
    client = redis.Redis.from_url(redis_server.url, socket_timeout=60)
    client.flushall()
    yield client
    client.close()
