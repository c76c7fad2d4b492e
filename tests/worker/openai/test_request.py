"""A chat or completions body becomes a validated protocol.Job, with the caller's fields set before it is
checked, or a RequestError naming what cannot run: the same mapping for the gateway and the Batch API."""

from __future__ import annotations

import pytest

from worker.openai.request import CHAT_URL, COMPLETIONS_URL, RequestError, completion_request
from worker.protocol import Job


def test_a_chat_body_becomes_a_job_with_the_callers_fields():
    body = {
        "model": "m",
        "messages": [{"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}],
    }
    asked = completion_request(CHAT_URL, body, "j1", {"tenant": "acme", "deadline_ms": 5})
    assert isinstance(asked.job, Job) and asked.model == "m" and asked.echo is None
    assert asked.job.messages is not None and asked.job.messages[0].role == "system"
    # No max_tokens: an explicit null, kept on the wire (the worker reads it as "up to the context").
    assert asked.job.wire() == {
        "id": "j1",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
        "max_tokens": None,
        "tenant": "acme",
        "deadline_ms": 5,
    }
    assert Job.model_validate_json(asked.job.model_dump_json(exclude_unset=True)) == asked.job


@pytest.mark.parametrize(
    ("body", "fields", "where"),
    [
        ({"prompt": "x", "n": "two"}, None, "n"),
        ({"prompt": "x", "temperature": True}, None, "temperature"),
        ({"prompt": "x"}, {"tenant": "a:b"}, "tenant"),
    ],
)
def test_a_job_the_worker_would_refuse_is_refused_here_naming_the_field(body, fields, where):
    with pytest.raises(RequestError) as info:
        completion_request(COMPLETIONS_URL, body, "j1", fields)
    assert info.value.code == "invalid_job" and info.value.message.startswith(f"{where}:")


def test_a_field_that_cannot_be_honoured_is_named():
    with pytest.raises(RequestError) as info:
        completion_request(COMPLETIONS_URL, {"prompt": "x", "logit_bias": {"1": 2}}, "j1")
    assert info.value.code == "unsupported_field" and "logit_bias" in info.value.message
