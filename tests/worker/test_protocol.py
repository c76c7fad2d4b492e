"""The wire schema and the pure helpers: no Redis, milliseconds."""

from __future__ import annotations

import json

import pytest

from engine.outputs import StepDelta
from engine.sampling_params import SamplingParams
from worker.cli.sizes import parse_size
from worker.error_codes import ErrorCode, JobError
from worker.intake.limits import Limits
from worker.intake.parse_job import parse_entry
from worker.keys import Keys
from worker.protocol import SAMPLING_FIELDS, DoneEvent, ErrorEvent, Job, TokenEvent, parse_event
from worker.publish.event_payloads import error_event, token_event
from worker.recover.resume_point import read_resume


def test_job_sampling_fields_match_the_engine():
    assert set(SAMPLING_FIELDS) == set(SamplingParams.model_fields)
    assert set(SAMPLING_FIELDS) <= set(Job.model_fields)


def test_job_round_trip():
    job = Job(id="a.b:c-1", messages=[{"role": "user", "content": "hi"}], max_tokens=5, stop="x", seed=3)
    again = Job.model_validate_json(job.model_dump_json())
    assert again == job
    assert SamplingParams(**again.sampling_kwargs()).stop == ["x"]


def test_events_round_trip_through_the_models():
    delta = StepDelta("r", 1, [5, 6], "ab", 3, logprobs=[[(5, -0.5), (7, -1.0)], [(6, -0.1)]])
    token = parse_event(token_event(delta, n=2))
    assert (
        isinstance(token, TokenEvent)
        and token.sample == 1
        and token.index == 3
        and token.logprobs[0][1] == (7, -1.0)
    )
    assert "sample" not in json.loads(token_event(delta, n=1))
    error = parse_event(error_event("invalid_job", "nope"))
    assert isinstance(error, ErrorEvent) and error.code == "invalid_job"
    done = {
        "type": "done",
        "finish_reason": "stop",
        "text": "t",
        "usage": {"prompt_tokens": 1, "completion_tokens": 2},
    }
    done["timing"] = {"queue_ms": 1.0, "ttft_ms": None, "total_ms": 3.0}
    assert isinstance(parse_event(json.dumps(done)), DoneEvent)


@pytest.mark.parametrize(
    ("raw", "code", "has_id"),
    [
        (b"\x00\xff", ErrorCode.INVALID_JSON, False),
        (b"null", ErrorCode.INVALID_JOB, False),
        (b'{"id": "x", "prompt": "p", "n": true}', ErrorCode.INVALID_JOB, True),
        (b'{"id": "x", "prompt": "p", "extra": 1}', ErrorCode.UNKNOWN_FIELD, True),
        (b'{"id": "' + b"x" * 129 + b'", "prompt": "p"}', ErrorCode.INVALID_JOB, False),
        (b'{"id": "x", "prompt_token_ids": [-1]}', ErrorCode.INVALID_JOB, True),
        (b'{"id": "x", "prompt": "p", "max_tokens": 99}', ErrorCode.MAX_TOKENS_TOO_LARGE, True),
    ],
)
def test_parse_entry_errors(raw, code, has_id):
    with pytest.raises(JobError) as info:
        parse_entry({b"job": raw}, Limits(max_tokens=50))
    assert info.value.code == code and (info.value.job_id is not None) == has_id


@pytest.mark.parametrize(
    "raw",
    [
        b'{"id": "x", "prompt": "p", "max_tokens": 4, "max_tokens": 8}',  # both valid: last would win
        b'{"id": "x", "messages": [{"role": "user", "role": "system", "content": "c"}]}',  # nested
    ],
)
def test_duplicate_keys_are_refused(raw):
    """docs/threat-model.md: a key given twice is refused, not resolved by "last one wins"."""
    with pytest.raises(JobError) as info:
        parse_entry({b"job": raw}, Limits())
    assert info.value.code == ErrorCode.INVALID_JOB and info.value.job_id == "x"
    assert "duplicate key" in info.value.message


@pytest.mark.parametrize(
    ("field", "literal"), [("temperature", "NaN"), ("top_p", "Infinity"), ("presence_penalty", "-Infinity")]
)
def test_non_finite_sampling_values_are_refused_as_such(field, literal):
    raw = f'{{"id": "x", "prompt": "p", "{field}": {literal}}}'.encode()
    with pytest.raises(JobError) as info:
        parse_entry({b"job": raw}, Limits())
    assert info.value.code == ErrorCode.INVALID_PARAMS
    assert info.value.message.startswith(f"{field}: must be a finite number")


def test_resume_reads_prior_tokens_and_next_seq():
    def entry(seq, event):
        return (f"0-{seq}".encode(), {b"event": json.dumps(event).encode()})

    entries = [
        entry(1, {"type": "token", "index": 0, "token_ids": [1, 2], "text": "", "sample": 0}),
        entry(2, {"type": "token", "index": 0, "token_ids": [9], "text": "", "sample": 1}),
        entry(3, {"type": "token", "index": 2, "token_ids": [3], "text": "", "sample": 0}),
        (b"0-4", {b"event": b"garbage"}),
    ]
    state = read_resume(entries)
    assert state.next_seq == 5 and not state.terminal
    assert state.prior_lists(3) == [[1, 2, 3], [9], []]
    assert read_resume([]).prior_lists(1) is None
    assert read_resume([entry(1, {"type": "done"})]).terminal


def test_keys_and_sizes():
    k = Keys("p", requests_stream="jobs")
    assert (k.requests, k.dead, k.out("a"), k.cancel("a"), k.cancel_channel) == (
        "jobs",
        "p:dead",
        "p:out:a",
        "p:cancel:a",
        "p:cancel",
    )
    assert (
        parse_size("80GiB") == 80 * 2**30
        and parse_size("512MiB") == 2**29
        and parse_size("1.5GB") == 1_500_000_000
    )
    with pytest.raises(ValueError):
        parse_size("lots")


@pytest.mark.parametrize(
    ("field", "value", "ok"),
    [
        ("tenant", "team-a.prod_1", True),
        ("tenant", "a:b", False),  # ':' and braces could forge a key or a lane name
        ("tenant", "{s1}", False),
        ("tenant", "x" * 65, False),
        ("affinity", "9f" * 32, True),
        ("affinity", "", False),
        ("affinity", "x" * 129, False),
    ],
)
def test_tenant_and_affinity_are_checked(field, value, ok):
    raw = json.dumps({"id": "j", "prompt": "hi", field: value})
    if ok:
        assert getattr(Job.model_validate_json(raw), field) == value
    else:
        with pytest.raises(ValueError):
            Job.model_validate_json(raw)


def test_prompt_logprobs_round_trip_on_the_first_token_event():
    job = Job(id="p", prompt="a b", prompt_logprobs=2, max_tokens=1)
    assert SamplingParams(**job.sampling_kwargs()).prompt_logprobs == 2
    prompt = [None, [(7, -1.5), (3, -0.5), (7, -1.5)], [(9, float("-inf")), (4, -0.1), (5, -0.2)]]
    pieces = [["a"], [" b", " c", " b"], [" d", " e", " f"]]
    delta = StepDelta("p", 0, [5], "x", 0, prompt_logprobs=prompt, prompt_logprob_tokens=pieces)
    raw = token_event(delta, n=1)
    token = parse_event(raw)
    assert isinstance(token, TokenEvent)
    assert token.prompt_logprobs == prompt and token.prompt_logprob_tokens == pieces
    # Events without them carry neither field.
    assert "prompt_logprobs" not in json.loads(token_event(StepDelta("p", 0, [6], "y", 1), n=1))
    # A claiming worker reads the event's tokens as published (so it does not ask for the prompt again).
    assert read_resume([(b"0-1", {b"event": raw})]).prior_lists(1) == [[5]]
