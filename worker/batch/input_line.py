"""One line of an OpenAI Batch input file -> a Conveyor job (worker/openai/request.py maps its body), or
the reason it cannot run.

    {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": {"model": ..., "messages": [...]}}
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from worker.openai.echo import Echo
from worker.openai.request import CHAT_URL, COMPLETIONS_URL, RequestError, completion_request
from worker.protocol import Job
from worker.strict_json import JSONRefused, loads_strict


@dataclass(frozen=True)
class BatchRequest:
    custom_id: str
    url: str
    job: Job
    model: str  # echoed in the response body
    echo: Echo | None = None  # a completions line's echo / prompt_logprobs (worker/openai/echo.py)


def parse_custom_id(line: str) -> str | None:
    """The custom_id of a line, or None when the line has none (it then fails in parse_line)."""
    try:
        value = loads_strict(line.encode()).get("custom_id")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, str) and value else None


def job_id_for(line: str) -> str:
    """Deterministic: a rerun after a crash enqueues the same id, so the worker deduplicates it and the
    runner collects the events of the job already run (or running)."""
    return "batch-" + hashlib.sha256(line.strip().encode()).hexdigest()[:32]


def parse_line(line: str, job_id: str | None = None, fields: Mapping[str, Any] | None = None) -> BatchRequest:
    """The line's job, named `job_id` (default: derived from the line, job_id_for), with `fields` set
    (the run's tenant, deadline_ms). Raises RequestError."""
    try:
        entry = loads_strict(line.encode())
    except JSONRefused as exc:
        raise RequestError("invalid_json", f"line: {exc}") from None
    if not isinstance(entry, dict):
        raise RequestError("invalid_request", "line is not a JSON object")
    custom_id, method, url, body = (entry.get(k) for k in ("custom_id", "method", "url", "body"))
    if not isinstance(custom_id, str) or not custom_id:
        raise RequestError("invalid_request", "custom_id must be a non-empty string")
    if method != "POST":
        raise RequestError("invalid_request", f"method must be POST, got {method!r}")
    if url not in (CHAT_URL, COMPLETIONS_URL):
        raise RequestError("invalid_url", f"url must be {CHAT_URL} or {COMPLETIONS_URL}, got {url!r}")
    if not isinstance(body, dict):
        raise RequestError("invalid_request", "body must be a JSON object")
    request = completion_request(url, body, job_id or job_id_for(line), fields)
    return BatchRequest(custom_id, url, request.job, request.model or "conveyor", request.echo)
