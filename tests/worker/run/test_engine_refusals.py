"""The worker maps an engine refusal by its reason code, in one table (worker/run/engine_refusals.py)."""

from __future__ import annotations

import pytest

from engine.errors import RejectReason, RequestRejected
from worker.error_codes import ErrorCode
from worker.run.engine_refusals import job_error

EXPECTED = {
    RejectReason.PROMPT_TOO_LONG: ErrorCode.PROMPT_TOO_LONG,
    RejectReason.BAD_MESSAGES: ErrorCode.INVALID_JOB,
    RejectReason.NO_CHAT_TEMPLATE: ErrorCode.INVALID_JOB,
    RejectReason.INVALID_CONSTRAINT: ErrorCode.INVALID_PARAMS,
}


@pytest.mark.parametrize("reason", list(RejectReason))
def test_every_reason_has_a_client_error_code_and_keeps_the_message(reason):
    error = job_error(RequestRejected(reason, f"because {reason.value}"), "job-1")
    assert error.code == EXPECTED.get(reason, ErrorCode.REJECTED)
    assert error.message == f"because {reason.value}" and error.job_id == "job-1"
