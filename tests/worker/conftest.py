"""A client of the module's real redis-server (tests/conftest.py), flushed per test."""

from __future__ import annotations

import sys

import pytest
import redis


@pytest.fixture
def r(redis_server):
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    yield client
    client.close()


@pytest.fixture(autouse=True)
def uncached_logging(monkeypatch):
    """In-process CLI runs configure structlog with cached loggers, which would keep later tests'
    `structlog.testing.capture_logs()` from seeing anything: run them uncached, and reset after each test."""
    import structlog

    from worker import logs

    configure = logs.configure

    def configure_uncached(*args, **kwargs) -> None:
        configure(*args, **kwargs)
        structlog.configure(cache_logger_on_first_use=False)

    monkeypatch.setattr(logs, "configure", configure_uncached)
    # Background workers of CLI tests log to stderr, as the CLI does, not into the stdout under test.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    yield
    structlog.reset_defaults()
