"""The Batch API's edges through `conveyor serve` and a real redis-server, the test serving the model
itself (tests/helpers/scripted_model.py): an input file that starts with a byte order mark, cancelling a
batch that is already cancelled, and the lines a batch's expiry cuts (OpenAI's `batch_expired`)."""

from __future__ import annotations

import io
import json

import httpx
import openai
import pytest

from tests.helpers.gateway import spawn_gateway
from tests.helpers.scripted_model import ScriptedModel, done
from tests.helpers.waiting import wait_until

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def gateway(redis_server, tmp_path_factory):
    logs = tmp_path_factory.mktemp("batch_edges")
    gateway = spawn_gateway(redis_server.url, logs, "--batch-poll-s", "0.1", "--batch-drain-s", "0.5")
    yield gateway
    gateway.stop()


@pytest.fixture(scope="module")
def model(redis_server):
    model = ScriptedModel(redis_server.url, name="scripted-batch")
    yield model
    model.close()


@pytest.fixture
def sdk(gateway):
    return openai.OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=30)


def _lines(model: ScriptedModel, *custom_ids: str) -> bytes:
    def line(custom_id: str) -> str:
        body = {"model": model.name, "messages": [{"role": "user", "content": custom_id}], "max_tokens": 2}
        return json.dumps(
            {"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions", "body": body}
        )

    return "".join(line(c) + "\r\n" for c in custom_ids).encode()


def _start(sdk, content: bytes, window: str = "1h"):
    upload = sdk.files.create(file=("in.jsonl", io.BytesIO(content)), purpose="batch")
    return sdk.batches.create(
        input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window=window
    )


def _jobs_of(model: ScriptedModel, batch_id: str, count: int) -> dict[str, str]:
    """custom_id (the prompt) -> job id, once the batch's `count` jobs are queued."""

    def queued() -> dict[str, str]:
        jobs = [j for j in model.jobs().values() if j["id"].startswith(batch_id)]
        return {j["messages"][0]["content"]: j["id"] for j in jobs} if len(jobs) >= count else {}

    return wait_until(queued, 30, f"{count} jobs of {batch_id}", 0.05)


def _final(sdk, batch_id: str):
    def ended():
        batch = sdk.batches.retrieve(batch_id)
        return batch if batch.status in ("completed", "failed", "cancelled", "expired") else None

    return wait_until(ended, 60, f"batch {batch_id} to end", 0.1)


def _file(sdk, file_id: str | None) -> dict[str, dict]:
    assert file_id is not None
    return {x["custom_id"]: x for x in map(json.loads, sdk.files.content(file_id).text.splitlines())}


def test_an_input_file_with_a_byte_order_mark_runs(sdk, model):
    batch = _start(sdk, b"\xef\xbb\xbf" + _lines(model, "bom-a", "bom-b"))
    for job_id in _jobs_of(model, batch.id, 2).values():
        model.emit(job_id, done("ok"))
    ended = _final(sdk, batch.id)
    assert ended.status == "completed", ended.errors
    assert set(_file(sdk, ended.output_file_id)) == {"bom-a", "bom-b"}


def test_cancelling_a_cancelled_batch_is_a_409(sdk, model):
    batch = _start(sdk, _lines(model, "cancel-a"))
    _jobs_of(model, batch.id, 1)
    assert sdk.batches.cancel(batch.id).status in ("cancelling", "cancelled")
    assert _final(sdk, batch.id).status == "cancelled"
    with pytest.raises(openai.ConflictError) as refused:
        sdk.batches.cancel(batch.id)
    assert refused.value.code == "batch_not_cancellable"


def test_the_lines_an_expiry_cuts_are_batch_expired(sdk, model):
    """Stopped by the worker at the deadline (running, or not started yet) or never answered: each is
    OpenAI's error line `batch_expired`, and the one answered before is in the output file."""
    batch = _start(sdk, _lines(model, "exp-done", "exp-running", "exp-queued", "exp-silent"), window="4s")
    jobs = _jobs_of(model, batch.id, 4)
    model.emit(jobs["exp-done"], done("ok"))
    model.emit(jobs["exp-running"], done("o", reason="abort", why="deadline"))
    error = {"type": "error", "code": "deadline_exceeded", "message": "the job's deadline passed"}
    model.emit(jobs["exp-queued"], error)
    ended = _final(sdk, batch.id)
    assert ended.status == "expired"
    assert set(_file(sdk, ended.output_file_id)) == {"exp-done"}
    errors = _file(sdk, ended.error_file_id)
    assert set(errors) == {"exp-running", "exp-queued", "exp-silent"}
    for line in errors.values():
        assert line["response"] is None and line["error"]["code"] == "batch_expired", line


def test_a_poisoned_output_stream_fails_its_line_and_the_batch_goes_on(sdk, model):
    batch = _start(sdk, _lines(model, "poison", "fine"))
    jobs = _jobs_of(model, batch.id, 2)
    model.emit_raw(jobs["poison"], b"[" * 5000 + b"]" * 5000)
    model.emit(jobs["fine"], done("ok"))
    ended = _final(sdk, batch.id)
    assert ended.status == "completed"
    assert set(_file(sdk, ended.output_file_id)) == {"fine"}
    (poisoned,) = _file(sdk, ended.error_file_id).values()
    assert poisoned["response"]["status_code"] == 500
    assert poisoned["response"]["body"]["error"]["code"] == "internal_error"


def test_a_hostile_batch_create_body_is_a_400(gateway, sdk, model):
    url = f"{gateway.base_url}/batches"
    upload = sdk.files.create(file=("in.jsonl", io.BytesIO(_lines(model, "x"))), purpose="batch")
    nested = b'{"input_file_id": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    twice = b'{"input_file_id": "%s", "input_file_id": "file-x", "endpoint": "/v1/chat/completions"}'
    for body in (nested, twice % upload.id.encode()):
        answer = httpx.post(url, content=body, headers={"content-type": "application/json"}, timeout=20)
        assert answer.status_code == 400, answer.text
        assert answer.json()["error"]["code"] == "invalid_json"
    wrong = httpx.post(url, json={"input_file_id": upload.id, "endpoint": 5}, timeout=20)
    assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "endpoint"
