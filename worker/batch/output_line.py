"""A job's terminal event -> one line of an OpenAI Batch output file.

    {"id": "batch_req_...", "custom_id": "r1", "error": null,
     "response": {"status_code": 200, "request_id": "<job id>", "body": <chat.completion | text_completion>}}

A job the worker refused (error event) gets its status code and an OpenAI error body; a line that never
became a job gets `response: null` and `error: {code, message}`, as OpenAI writes them.
"""

from __future__ import annotations

import json
import uuid

from worker.batch.sink import EXPIRED
from worker.error_codes import ErrorCode, http_status
from worker.openai.echo import Echo, PromptScores
from worker.openai.logprobs import SampleLogprobs
from worker.openai.response import finish_reasons, response_body
from worker.protocol import DoneEvent, ErrorEvent


def _line(custom_id: str, response: dict | None, error: dict | None) -> str:
    entry = {
        "id": f"batch_req_{uuid.uuid4().hex}",
        "custom_id": custom_id,
        "response": response,
        "error": error,
    }
    return json.dumps(entry, ensure_ascii=False) + "\n"


def line_error(custom_id: str, code: str, message: str) -> str:
    return _line(custom_id, None, {"code": code, "message": message})


def from_event(
    custom_id: str,
    url: str,
    model: str,
    job_id: str,
    event: DoneEvent | ErrorEvent,
    logprobs: dict[int, SampleLogprobs] | None = None,
    echo: Echo | None = None,
    prompt: PromptScores | None = None,
) -> tuple[str, bool, int]:
    """(output line, succeeded, completion tokens) for the job's terminal event. `logprobs` (per sample,
    gathered from the token events) when the line asked for them; `echo` and the prompt's scores (from the
    token events) for a completions line with echo or prompt_logprobs. A job stopped at its deadline (a
    batch's jobs carry its window's end as theirs) is a line the window cut: OpenAI's `batch_expired` error
    line."""
    if _past_deadline(event):
        return line_error(custom_id, EXPIRED.code, EXPIRED.message), False, 0
    if isinstance(event, ErrorEvent):
        status, type_ = http_status(event.code)
        error = {"message": event.message, "type": type_, "param": None, "code": event.code}
        response = {"status_code": status, "request_id": job_id, "body": {"error": error}}
        return _line(custom_id, response, None), False, 0
    if "abort" in finish_reasons(event):  # cancelled or past its deadline: no completion to report
        why = event.reason or "aborted"
        error = {
            "message": f"the job was stopped ({why})",
            "type": "server_error",
            "param": None,
            "code": why,
        }
        return (
            _line(custom_id, {"status_code": 500, "request_id": job_id, "body": {"error": error}}, None),
            False,
            0,
        )
    body = response_body(url, model, job_id, event, logprobs, echo, prompt)
    completion = body["usage"]["completion_tokens"]
    return _line(custom_id, {"status_code": 200, "request_id": job_id, "body": body}, None), True, completion


def _past_deadline(event: DoneEvent | ErrorEvent) -> bool:
    if isinstance(event, ErrorEvent):
        return event.code == ErrorCode.DEADLINE_EXCEEDED.value  # stopped before it started
    return "abort" in finish_reasons(event) and event.reason == "deadline"
