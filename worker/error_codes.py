"""Error codes a client may see in an error event, and the exception that carries one."""

from __future__ import annotations

import enum


class ErrorCode(str, enum.Enum):
    INVALID_JSON = "invalid_json"  # not UTF-8 JSON, or no `job` field
    INVALID_JOB = "invalid_job"  # wrong types, missing/extra prompt, bad id
    UNKNOWN_FIELD = "unknown_field"
    INVALID_PARAMS = "invalid_params"  # sampling parameters the engine cannot honour
    PAYLOAD_TOO_LARGE = "payload_too_large"
    PROMPT_TOO_LONG = "prompt_too_long"
    MAX_TOKENS_TOO_LARGE = "max_tokens_too_large"
    REJECTED = "rejected"  # the engine refused the request (reason in the message)
    DEADLINE_EXCEEDED = "deadline_exceeded"
    TOO_MANY_ATTEMPTS = "too_many_attempts"
    INTERNAL = "internal_error"


# Each code as an HTTP status and OpenAI error type: the gateway's answers (worker/gateway/errors.py) and the
# Batch API's output lines (worker/batch/output_line.py) both read this one table.
HTTP_STATUS: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_JSON: (400, "invalid_request_error"),
    ErrorCode.INVALID_JOB: (400, "invalid_request_error"),
    ErrorCode.UNKNOWN_FIELD: (400, "invalid_request_error"),
    ErrorCode.INVALID_PARAMS: (400, "invalid_request_error"),
    ErrorCode.PAYLOAD_TOO_LARGE: (413, "invalid_request_error"),
    ErrorCode.PROMPT_TOO_LONG: (400, "invalid_request_error"),
    ErrorCode.MAX_TOKENS_TOO_LARGE: (400, "invalid_request_error"),
    ErrorCode.REJECTED: (400, "invalid_request_error"),
    ErrorCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
    ErrorCode.TOO_MANY_ATTEMPTS: (500, "server_error"),
    ErrorCode.INTERNAL: (500, "server_error"),
}


def http_status(code: str) -> tuple[int, str]:
    """(status, OpenAI error type) of a worker error code; a code this version does not know is a 500."""
    try:
        return HTTP_STATUS[ErrorCode(code)]
    except ValueError:
        return 500, "server_error"


class JobError(Exception):
    """A job that cannot be run. `job_id` is set when the payload named a usable id."""

    def __init__(self, code: ErrorCode, message: str, job_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.job_id = job_id
