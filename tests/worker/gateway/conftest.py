"""One worker serving the tiny model as "tiny" and one gateway in front of it, per test module."""

from __future__ import annotations

import pytest

from tests.helpers.gateway import spawn_gateway
from tests.helpers.rel_helpers import Workers

MODEL = "tiny"
KEY = "sk-test-acme"
TENANT = "acme"


@pytest.fixture(scope="module")
def served(redis_server, tiny_model, tmp_path_factory):
    """(redis url, the gateway process, the worker process) with the worker live behind the gateway."""
    logs = tmp_path_factory.mktemp("gateway")
    workers = Workers(tiny_model, logs)
    worker = workers.spawn(redis_server.url, "gw-w1", "--served-model-name", MODEL, group="tiny")
    gateway = spawn_gateway(redis_server.url, logs, "--api-key", f"{TENANT}={KEY}")
    try:
        worker.wait_started()
        yield redis_server.url, gateway, worker
    finally:
        gateway.stop()
        workers.stop_all()


@pytest.fixture
def sdk(served):
    import openai

    return openai.OpenAI(base_url=served[1].base_url, api_key=KEY, max_retries=0, timeout=60)
