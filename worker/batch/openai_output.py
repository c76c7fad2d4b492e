"""A job's terminal event -> one line of an OpenAI Batch output file.

    {"id": "batch_req_...", "custom_id": "r1", "error": null,
     "response": {"status_code": 200, "request_id": "<job id>", "body": <chat.completion | text_completion>}}

A job the worker refused (error event) gets its status code and an OpenAI error body; a line that never
became a job gets `response: null` and `error: {code, message}`, as OpenAI writes them.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from worker.batch.openai_echo import Echo, PromptScores, echo_choice
from worker.batch.openai_input import CHAT_URL
from worker.batch.openai_logprobs import SampleLogprobs, chat_logprobs, completion_logprobs
from worker.batch.sink import EXPIRED
from worker.error_codes import ErrorCode, http_status


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
    event: dict,
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
    if event.get("type") == "error":
        code = str(event.get("code", "internal_error"))
        status, type_ = http_status(code)
        error = {"message": event.get("message", ""), "type": type_, "param": None, "code": code}
        response = {"status_code": status, "request_id": job_id, "body": {"error": error}}
        return _line(custom_id, response, None), False, 0
    reasons = event.get("finish_reasons") or [event.get("finish_reason", "stop")]
    if "abort" in reasons:  # cancelled or past its deadline: no completion to report
        why = event.get("reason") or "aborted"
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


def _past_deadline(event: dict) -> bool:
    if event.get("type") == "error":
        return event.get("code") == ErrorCode.DEADLINE_EXCEEDED.value  # stopped before it started
    reasons = event.get("finish_reasons") or [event.get("finish_reason")]
    return "abort" in reasons and event.get("reason") == "deadline"


def response_body(
    url: str,
    model: str,
    job_id: str,
    event: dict,
    logprobs: dict[int, SampleLogprobs] | None = None,
    echo: Echo | None = None,
    scores: PromptScores | None = None,
) -> dict[str, Any]:
    """A done event as OpenAI's `chat.completion` or `text_completion` body (the gateway's answer too).
    `echo`: a completions body's echo / prompt_logprobs, with the prompt's scores (worker/batch/openai_echo.py)."""
    texts = event.get("texts") or [event.get("text", "")]
    reasons = event.get("finish_reasons") or [event.get("finish_reason", "stop")]
    usage = event.get("usage", {})
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    chat = url == CHAT_URL
    choices: list[dict[str, Any]] = []
    for k, (text, reason) in enumerate(zip(texts, reasons, strict=True)):
        shown = None
        if logprobs is not None:
            sample = logprobs.get(k, SampleLogprobs())
            shown = chat_logprobs(sample) if chat else completion_logprobs(sample)
        if chat:
            message = {"role": "assistant", "content": text}
            choices.append({"index": k, "message": message, "finish_reason": reason, "logprobs": shown})
        else:
            choice = {"index": k, "text": text, "finish_reason": reason, "logprobs": shown}
            choices.append(choice if echo is None else echo_choice(echo, choice, scores))
    if echo is not None and echo.only:
        completion = 0  # the one token generated to score the prompt is not shown
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{job_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
