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


class JobError(Exception):
    """A job that cannot be run. `job_id` is set when the payload named a usable id."""

    def __init__(self, code: ErrorCode, message: str, job_id: str | None = None) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message
        self.job_id = job_id
