"""Each error status of the gateway as OpenAI's error object, raised by the `openai` SDK as its matching
exception class: 400 (a field that cannot be honoured, a job the worker refuses), 401, 404, 413, 429 with
Retry-After, 503 and 504. Models without a worker are made with real registry records and streams."""

from __future__ import annotations

import openai
import pytest
import redis

from tests.helpers.gateway import spawn_gateway
from tests.worker.gateway.conftest import KEY, MODEL, TENANT
from worker.fleet.heartbeat import Heartbeat
from worker.keys import Keys, requests_stream_name

pytestmark = [pytest.mark.redis, pytest.mark.timeout(240)]
K = Keys()
ASK = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def strict(served, tmp_path_factory):
    """A second gateway with tight limits, in front of the same worker."""
    gateway = spawn_gateway(
        served[0],
        tmp_path_factory.mktemp("strict"),
        *("--api-key", f"{TENANT}={KEY}", "--max-body-bytes", "65536"),
        *("--max-queued", "2", "--request-timeout", "1"),
    )
    yield openai.OpenAI(base_url=gateway.base_url, api_key=KEY, max_retries=0, timeout=30)
    gateway.stop()


def fake_model(url: str, name: str, queued: int = 0) -> None:
    """A live registry record for `name` whose stream nobody reads, with `queued` jobs waiting on it."""
    client = redis.Redis.from_url(url)
    stream = requests_stream_name(K.prefix, name)
    Heartbeat(
        client, K, consumer=f"fake-{name}", model=name, group=name, streams=[stream],
        max_model_len=64, capacity=1, interval_s=60,
    ).beat()  # fmt: skip
    client.xgroup_create(stream, name, id="$", mkstream=True)
    for k in range(queued):
        client.xadd(stream, {"job": f'{{"id": "q{k}", "prompt": "x"}}'})


def test_400_names_the_fields_it_cannot_honour(sdk):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(model=MODEL, messages=ASK, tools=[tool])
    assert "tools" in err.value.message and err.value.code == "unsupported_field"
    with pytest.raises(openai.BadRequestError) as err:
        sdk.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )
    assert "text" in err.value.message


def test_400_for_a_job_the_worker_refuses_streamed_or_not(sdk):
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as err:
            sdk.chat.completions.create(
                model=MODEL, messages=ASK, max_tokens=4, temperature=-1, stream=stream
            )
        assert err.value.code == "invalid_params"


def test_401_for_a_missing_or_wrong_key(served):
    wrong = openai.OpenAI(base_url=served[1].base_url, api_key="sk-wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    with pytest.raises(openai.AuthenticationError):
        wrong.chat.completions.create(model=MODEL, messages=ASK)


def test_404_for_a_model_nobody_serves(sdk):
    with pytest.raises(openai.NotFoundError) as err:
        sdk.chat.completions.create(model="no-such-model", messages=ASK)
    assert err.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        sdk.models.retrieve("no-such-model")


def test_413_for_a_body_over_the_limit(strict):
    with pytest.raises(openai.APIStatusError) as err:
        strict.completions.create(model=MODEL, prompt="x" * 70_000, max_tokens=1)
    assert err.value.status_code == 413 and err.value.code == "payload_too_large"


def test_429_with_retry_after_when_the_queue_is_over_the_limit(strict, served):
    fake_model(served[0], "busy", queued=2)
    with pytest.raises(openai.RateLimitError) as err:
        strict.chat.completions.create(model="busy", messages=ASK)
    assert err.value.response.headers["retry-after"] == "1" and err.value.code == "queue_full"


def test_503_when_the_models_workers_are_gone(sdk, served):
    client = redis.Redis.from_url(served[0])
    client.xgroup_create(requests_stream_name(K.prefix, "gone"), "gone", id="$", mkstream=True)
    with pytest.raises(openai.InternalServerError) as err:
        sdk.chat.completions.create(model="gone", messages=ASK)
    assert err.value.status_code == 503 and err.value.code == "no_live_worker"


def test_504_past_the_request_timeout_and_the_job_is_cancelled(strict, served):
    fake_model(served[0], "stalled")
    with pytest.raises(openai.InternalServerError) as err:
        strict.chat.completions.create(model="stalled", messages=ASK, extra_headers={"X-Request-Id": "late"})
    assert err.value.status_code == 504 and err.value.code == "timeout"
    assert redis.Redis.from_url(served[0]).exists(K.cancel(f"{TENANT}:late"))
