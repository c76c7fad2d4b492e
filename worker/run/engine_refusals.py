"""The one place an engine refusal (`RequestRejected.reason`) becomes the error code a client sees."""

from __future__ import annotations

from engine.errors import RejectReason, RequestRejected
from worker.error_codes import ErrorCode, JobError

_CODES = {
    RejectReason.PROMPT_TOO_LONG: ErrorCode.PROMPT_TOO_LONG,
    RejectReason.BAD_MESSAGES: ErrorCode.INVALID_JOB,
    RejectReason.NO_CHAT_TEMPLATE: ErrorCode.INVALID_JOB,
    RejectReason.INVALID_CONSTRAINT: ErrorCode.INVALID_PARAMS,
    # The rest (an empty prompt, too long with max_tokens, too big for the KV pool, token ids outside the
    # vocabulary, a duplicate id, a resume that does not match n) is the engine's own refusal.
}


def job_error(rejected: RequestRejected, job_id: str) -> JobError:
    return JobError(_CODES.get(rejected.reason, ErrorCode.REJECTED), rejected.message, job_id)
