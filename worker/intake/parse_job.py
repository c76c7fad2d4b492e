"""Turning a raw stream entry into a validated Job, or a JobError that names the job when it can.

Nothing here trusts the payload: bytes may be any binary, JSON may be any shape. Parsing is JSON only
(never pickle or eval), and every failure becomes a JobError.
"""

from __future__ import annotations

import json
import math
import re

from pydantic import ValidationError

from worker.error_codes import ErrorCode, JobError
from worker.intake.limits import Limits, check_max_tokens, check_payload
from worker.keys import JOB_FIELD
from worker.protocol import JOB_ID_PATTERN, SAMPLING_FIELDS, Job

_ID_RE = re.compile(JOB_ID_PATTERN)
# An oversized payload is not parsed; its id is looked for near the start, where clients put it.
_ID_PREFIX_RE = re.compile(rb'^\s*\{[^{}\[\]]*?"id"\s*:\s*"([A-Za-z0-9._:-]{1,128})"')
_PREFIX_BYTES = 4096


def parse_entry(fields: dict[bytes, bytes] | None, limits: Limits) -> Job:
    if not fields or JOB_FIELD not in fields:
        raise JobError(ErrorCode.INVALID_JSON, "entry has no 'job' field")
    raw = fields[JOB_FIELD]
    if len(raw) > limits.max_payload_bytes:
        check_payload(raw, limits, _id_from_prefix(raw))  # raises, naming the id when it can
    try:
        text = raw.decode("utf-8")
        json.loads(text, object_pairs_hook=_refuse_duplicates)  # "not JSON" apart from "wrong shape"
    except DuplicateKey as exc:
        raise JobError(ErrorCode.INVALID_JOB, str(exc), salvage_id(text)) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:  # RecursionError: absurd nesting
        raise JobError(ErrorCode.INVALID_JSON, f"job is not UTF-8 JSON: {str(exc)[:200]}") from None
    job_id = salvage_id(text)
    try:
        job = Job.model_validate_json(text)
    except ValidationError as exc:
        raise _validation_error(exc, job_id) from None
    check_max_tokens(job.max_tokens, limits, job.id)
    _check_finite(job)
    return job


class DuplicateKey(ValueError):
    pass


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """json's object hook: a key given twice is refused (otherwise the last one would silently win)."""
    obj: dict = {}
    for key, value in pairs:
        if key in obj:
            raise DuplicateKey(f"duplicate key {key[:64]!r} in the job")
        obj[key] = value
    return obj


def _check_finite(job: Job) -> None:
    """JSON parsers accept NaN and Infinity; no sampling parameter means anything with them."""
    for name in SAMPLING_FIELDS:
        value = getattr(job, name)
        if isinstance(value, float) and not math.isfinite(value):
            raise JobError(ErrorCode.INVALID_PARAMS, f"{name}: must be a finite number, got {value}", job.id)


def salvage_id(text: str) -> str | None:
    """The job's id when the payload is a JSON object with a valid `id`, so its error can be streamed."""
    try:
        obj = json.loads(text)
    except (ValueError, RecursionError):
        return None
    job_id = obj.get("id") if isinstance(obj, dict) else None
    return job_id if isinstance(job_id, str) and _ID_RE.match(job_id) else None


def _validation_error(exc: ValidationError, job_id: str | None) -> JobError:
    errors = exc.errors(include_url=False, include_input=False)
    unknown = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        return JobError(ErrorCode.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", job_id)
    first = errors[0]
    where = ".".join(map(str, first["loc"])) or "job"
    return JobError(ErrorCode.INVALID_JOB, f"{where}: {first['msg']}", job_id)


def _id_from_prefix(raw: bytes) -> str | None:
    """The top-level `id` of an oversized payload, when it comes before any nested object or list."""
    match = _ID_PREFIX_RE.match(raw[:_PREFIX_BYTES])
    return match.group(1).decode() if match else None
