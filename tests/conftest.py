"""Shared fixtures: tiny random checkpoints, made once per session and loadable offline."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

# Property tests check properties, not speed: hypothesis's per-example deadline (200 ms) fails them on a
# loaded CI machine. Examples that hang are still caught by pytest-timeout.
settings.register_profile("conveyor", deadline=None)
settings.load_profile("conveyor")

# Without a GPU, Triton kernels run on the interpreter; it must be chosen before `triton.jit` runs.
try:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
except ImportError:  # the protocol and scheduler tests need no torch
    pass
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Callable[..., Path]:
    """`tiny_model_dir(arch, **make_tiny_model_overrides) -> Path`, each distinct call made once."""
    from engine.tiny_model import make_tiny_model

    made: dict[tuple, Path] = {}

    def get(arch: str = "llama", **overrides) -> Path:
        key = (arch, tuple(sorted((k, repr(v)) for k, v in overrides.items())))
        if key not in made:
            out = tmp_path_factory.mktemp(f"tiny_{arch}")
            made[key] = make_tiny_model(out, arch, **overrides)
        return made[key]

    return get


@pytest.fixture(scope="module")
def redis_server():
    """A real redis-server for one test module (no fakeredis), on a free loopback port, stopped by PID."""
    from worker import local_redis

    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    server = local_redis.start()
    yield server
    server.stop()


@pytest.fixture
def own_server():
    """`own_server(*extra_args, password=None)`: a redis-server of this test's own (it gets filled,
    refused to, or stopped), each one stopped by PID after the test."""
    from worker import local_redis

    if local_redis.redis_server_path() is None:
        pytest.skip("redis-server is not installed")
    servers: list[local_redis.LocalRedis] = []

    def start(*extra_args: str, password: str | None = None) -> local_redis.LocalRedis:
        servers.append(local_redis.start(extra_args=list(extra_args), password=password))
        return servers[-1]

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def tiny_model(tiny_model_dir) -> str:
    """The real engine's tiny random Llama checkpoint, as a path string (what the worker tests pass around)."""
    return str(tiny_model_dir("llama"))


@pytest.fixture(autouse=True)
def uncached_logging(monkeypatch):
    """In-process CLI runs (tests/worker, tests/cluster) configure structlog with cached loggers, which
    would keep any later test's `structlog.testing.capture_logs()` from seeing anything: run them
    uncached, and reset after every test."""
    import structlog

    from worker.cli import logs

    configure = logs.configure

    def configure_uncached(*args, **kwargs) -> None:
        configure(*args, **kwargs)
        structlog.configure(cache_logger_on_first_use=False)

    monkeypatch.setattr(logs, "configure", configure_uncached)
    # Background workers of CLI tests log to stderr, as the CLI does, not into the stdout under test.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    yield
    structlog.reset_defaults()
