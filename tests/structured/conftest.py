"""An engine on the tiny random model, shared by a module (each engine starts one grammar compile process)."""

from __future__ import annotations

import pytest

pytest.importorskip("xgrammar")


@pytest.fixture(scope="module")
def llm(tiny_model_dir):
    from engine import LLMEngine

    engine = LLMEngine(
        str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=16, dtype="float32", device="cpu"
    )
    yield engine
    engine.structured.close()


@pytest.fixture(scope="module")
def redis_server():
    from worker import local_redis

    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    server = local_redis.start()
    yield server
    server.stop()


@pytest.fixture
def r(redis_server):
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()
