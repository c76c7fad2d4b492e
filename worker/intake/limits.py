"""Size limits on what a client may ask for, each failing with its own error code.

The prompt's length is the engine's to check (it alone tokenizes): see EngineConfig.max_prompt_tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.config import knob
from worker.error_codes import ErrorCode, JobError


@dataclass(frozen=True)
class Limits:
    max_payload_bytes: int = knob(1 << 20, "largest job payload accepted")
    max_tokens: int | None = knob(None, "largest max_tokens a job may ask for", cli="max-tokens-limit")


def check_payload(raw: bytes, limits: Limits, job_id: str | None = None) -> None:
    if len(raw) > limits.max_payload_bytes:
        raise JobError(
            ErrorCode.PAYLOAD_TOO_LARGE,
            f"payload is {len(raw)} bytes, the limit is {limits.max_payload_bytes}",
            job_id,
        )


def check_max_tokens(max_tokens: int | None, limits: Limits, job_id: str) -> None:
    if max_tokens is not None and limits.max_tokens is not None and max_tokens > limits.max_tokens:
        raise JobError(
            ErrorCode.MAX_TOKENS_TOO_LARGE,
            f"max_tokens {max_tokens} exceeds the limit {limits.max_tokens}",
            job_id,
        )
