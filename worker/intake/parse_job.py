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
from worker.intake.json_scan import MAX_JSON_DEPTH, scan_payload
from worker.intake.limits import Limits, check_max_tokens, check_payload
from worker.keys import JOB_FIELD
from worker.protocol import JOB_ID_PATTERN, SAMPLING_FIELDS, Job

_ID_RE = re.compile(JOB_ID_PATTERN)
# An oversized payload is not scanned whole; its id is looked for near the start, where clients put it.
_PREFIX_BYTES = 4096


def parse_entry(fields: dict[bytes, bytes] | None, limits: Limits) -> Job:
    if not fields or JOB_FIELD not in fields:
        raise JobError(ErrorCode.INVALID_JSON, "entry has no 'job' field")
    raw = fields[JOB_FIELD]
    if len(raw) > limits.max_payload_bytes:
        check_payload(raw, limits, scan_payload(raw[:_PREFIX_BYTES], _ID_RE).job_id)  # raises
    # Depth and id come from a non-recursive scan of the bytes: a payload no parser may see (too deep)
    # or can read (not UTF-8, truncated) is still answered on the stream of the id it names.
    scan = scan_payload(raw, _ID_RE)
    if scan.too_deep:
        raise JobError(ErrorCode.INVALID_JSON, f"job is nested deeper than {MAX_JSON_DEPTH}", scan.job_id)
    try:
        text = raw.decode("utf-8")
        json.loads(text, object_pairs_hook=_refuse_duplicates)  # "not JSON" apart from "wrong shape"
    except DuplicateKey as exc:
        raise JobError(ErrorCode.INVALID_JOB, str(exc), scan.job_id) from None
    except (UnicodeDecodeError, ValueError) as exc:
        reason = f"job is not UTF-8 JSON: {str(exc)[:200]}"
        raise JobError(ErrorCode.INVALID_JSON, reason, scan.job_id) from None
    try:
        job = Job.model_validate_json(text)
    except ValidationError as exc:
        raise _validation_error(exc, scan.job_id) from None
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


def _validation_error(exc: ValidationError, job_id: str | None) -> JobError:
    errors = exc.errors(include_url=False, include_input=False)
    unknown = [".".join(map(str, e["loc"])) for e in errors if e["type"] == "extra_forbidden"]
    if unknown:
        return JobError(ErrorCode.UNKNOWN_FIELD, f"unknown field(s): {', '.join(unknown)}", job_id)
    first = errors[0]
    where = ".".join(map(str, first["loc"])) or "job"
    return JobError(ErrorCode.INVALID_JOB, f"{where}: {first['msg']}", job_id)
