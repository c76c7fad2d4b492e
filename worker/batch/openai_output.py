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

from worker.batch.openai_input import CHAT_URL

# Worker error codes that are the caller's fault (HTTP 400); the rest are the server's (500).
_CLIENT_ERRORS = {
    "invalid_json",
    "invalid_job",
    "unknown_field",
    "invalid_params",
    "payload_too_large",
    "prompt_too_long",
    "max_tokens_too_large",
    "rejected",
    "deadline_exceeded",
}


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


def from_event(custom_id: str, url: str, model: str, job_id: str, event: dict) -> tuple[str, bool, int]:
    """(output line, succeeded, completion tokens) for the job's terminal event."""
    if event.get("type") == "error":
        code = str(event.get("code", "internal_error"))
        body: dict[str, Any] = {
            "error": {
                "message": event.get("message", ""),
                "type": "invalid_request_error",
                "param": None,
                "code": code,
            }
        }
        if code not in _CLIENT_ERRORS:
            body["error"]["type"] = "server_error"
        status = 400 if code in _CLIENT_ERRORS else 500
        return _line(custom_id, {"status_code": status, "request_id": job_id, "body": body}, None), False, 0
    texts = event.get("texts") or [event.get("text", "")]
    reasons = event.get("finish_reasons") or [event.get("finish_reason", "stop")]
    usage = event.get("usage", {})
    prompt, completion = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
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
    chat = url == CHAT_URL
    choices: list[dict[str, Any]] = [
        {
            "index": k,
            "message": {"role": "assistant", "content": text},
            "finish_reason": reason,
            "logprobs": None,
        }
        if chat
        else {"index": k, "text": text, "finish_reason": reason, "logprobs": None}
        for k, (text, reason) in enumerate(zip(texts, reasons, strict=True))
    ]
    body = {
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
    return _line(custom_id, {"status_code": 200, "request_id": job_id, "body": body}, None), True, completion
