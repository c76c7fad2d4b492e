"""A client of the module's real redis-server (tests/conftest.py), flushed per test."""

from __future__ import annotations

import pytest
import redis


@pytest.fixture
def r(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()
