"""Payloads no parser can read but whose top-level `id` is readable are refused naming that id."""

from __future__ import annotations

import pytest

from worker.error_codes import ErrorCode, JobError
from worker.intake.json_scan import MAX_JSON_DEPTH
from worker.intake.limits import Limits
from worker.intake.parse_job import parse_entry

DEEP = 10_000  # far past the interpreter's recursion limit


def _refusal(raw: bytes, limits: Limits | None = None) -> JobError:
    with pytest.raises(JobError) as info:
        parse_entry({b"job": raw}, limits or Limits())
    return info.value


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": "u1", "prompt": "caf\xe9"}',  # Latin-1, not UTF-8
        b'{"id": "u1", "prompt": "\xed\xa0\x80"}',  # a raw (UTF-8 encoded) lone surrogate
        b'{"prompt": "\xff\xfe", "id": "u1", "max_tokens": 4}',  # the id after the bad bytes
        b'{"id": "u1", "prompt": "trunc',  # cut short
        b'{"id": "u1", "prompt": "x", "stop": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        b'{"id": "u1", "prompt": ' + b'{"a":' * DEEP + b"1" + b"}" * DEEP + b"}",
        b'{"id": "\\u0075\\u0031", "prompt": "\xff"}',  # an escaped id is still the id "u1"
    ],
    ids=["latin1", "surrogate", "id-after-bad-bytes", "truncated", "deep-list", "deep-object", "escaped-id"],
)
def test_an_unreadable_job_with_a_readable_id_is_refused_naming_it(raw):
    error = _refusal(raw)
    assert error.code == ErrorCode.INVALID_JSON and error.job_id == "u1"


@pytest.mark.parametrize(
    "raw",
    [
        b"\xff" + b'"id": "u1"',  # not an object
        b'{"x": {"id": "u1"}, "prompt": "\xff"}',  # not top-level
        b'["id", "u1", "\xff"]',
        b'{"x": "id", "y": "u1\xff"}',  # "id" as a value
        b'{"id": "u1", "id": "u2", "prompt": "\xff"}',  # two ids name no one stream
        b'{"id": "a b", "prompt": "\xff"}',  # not a valid id
        b'{"id": "u\xff1", "prompt": "x"}',  # the id itself is not UTF-8
        b'{"id": 7, "prompt": "\xff"}',
        b"[" * DEEP + b'{"id": "u1"}' + b"]" * DEEP,
    ],
    ids=[
        "not-object",
        "nested",
        "list",
        "id-as-value",
        "two-ids",
        "bad-id",
        "id-not-utf8",
        "id-number",
        "deep",
    ],
)
def test_no_id_is_named_unless_the_top_level_object_gives_one(raw):
    assert _refusal(raw).job_id is None


def test_depth_is_refused_before_any_recursive_parser_runs():
    """The limit is checked on the bytes: json.loads never sees a payload past MAX_JSON_DEPTH."""
    nested = b'{"id": "d1", "prompt": "x", "stop": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
    error = _refusal(nested)
    assert error.code == ErrorCode.INVALID_JSON and error.job_id == "d1"
    assert f"nested deeper than {MAX_JSON_DEPTH}" in error.message
    # One level less is JSON the schema refuses (a list of lists is not a stop string), not "too deep".
    depth = MAX_JSON_DEPTH - 1
    shallow = b'{"id": "d1", "prompt": "x", "stop": ' + b"[" * depth + b"]" * depth + b"}"
    assert _refusal(shallow).code == ErrorCode.INVALID_JOB


def test_an_oversized_payload_names_an_id_from_its_start():
    raw = b'{"meta": {"a": [1]}, "id": "big1", "prompt": "' + b"z" * 5000 + b'"}'
    error = _refusal(raw, Limits(max_payload_bytes=1000))
    assert error.code == ErrorCode.PAYLOAD_TOO_LARGE and error.job_id == "big1"
