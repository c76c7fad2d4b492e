"""Fixtures for issue #5's acceptance tests: our own redis-server(s) and `conveyor worker` processes."""

from __future__ import annotations

import pytest

from tests.helpers.rel_helpers import Workers, make_redis, redis_binary


@pytest.fixture(scope="session")
def model(tiny_model_dir) -> str:
    return str(tiny_model_dir("llama"))


@pytest.fixture
def redis_factory(tmp_path):
    """`redis_factory(**make_redis kwargs)` -> a started RedisProc in its own folder; all stopped by PID."""
    if redis_binary() is None:
        pytest.skip("redis-server is not installed")
    made = []

    def make(**kw):
        folder = tmp_path / f"redis{len(made)}"
        folder.mkdir()
        server = make_redis(folder, **kw)
        made.append(server)
        return server.start()

    yield make
    for server in made:
        server.stop()


@pytest.fixture
def server(redis_factory):
    return redis_factory()


@pytest.fixture
def workers(model, tmp_path):
    pool = Workers(model, tmp_path)
    yield pool
    pool.stop_all()
