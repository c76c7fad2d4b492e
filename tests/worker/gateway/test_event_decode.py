"""Events are decoded by orjson, and by json.loads where orjson refuses what the worker wrote: the same
values either way."""

from __future__ import annotations

import json
import math

import pytest

from worker.gateway.job_io import NOT_AN_EVENT, TERMINAL, parse_json, until_terminal
from worker.keys import EVENT_FIELD

EVENTS = [
    {
        "type": "token",
        "index": 3,
        "token_ids": [17],
        "text": ' caf\u00e9 \u2603 "q" \\',
        "logprobs": [[[17, -0.5]]],
    },
    {"type": "done", "finish_reason": "length", "usage": {"prompt_tokens": 4}, "timing": {"ttft_ms": None}},
]


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: e["type"])
def test_what_orjson_reads_is_what_json_reads(event):
    raw = json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()  # as the worker writes it
    assert parse_json(raw) == json.loads(raw) == event


def test_a_minus_infinity_logprob_falls_back_to_json():
    # A token that cannot be sampled (masked out) has logprob -inf; json.dumps writes -Infinity, which is
    # not JSON, and orjson refuses it.
    event = {
        "type": "token",
        "index": 0,
        "token_ids": [7],
        "text": "a",
        "logprobs": [[[7, -0.25], [9, -math.inf]]],
    }
    raw = json.dumps(event).encode()
    assert b"-Infinity" in raw
    decoded = parse_json(raw)
    assert decoded["logprobs"][0][1][1] == -math.inf and decoded == event


def test_nan_and_lone_surrogates_fall_back_too():
    assert math.isnan(parse_json(b'{"x":NaN}')["x"])
    assert parse_json(b'{"text":"\\ud800"}') == {"text": "\ud800"}


def test_what_neither_reads_is_still_an_error():
    with pytest.raises(ValueError):
        parse_json(b'{"type": "tok')


def test_until_terminal_decodes_each_entry_and_stops_at_the_terminal_one():
    entries = [
        (
            b"0-1",
            {EVENT_FIELD: json.dumps({"type": "token", "index": 0, "logprobs": [[[1, -math.inf]]]}).encode()},
        ),
        (b"0-2", {EVENT_FIELD: json.dumps(EVENTS[1]).encode()}),
        (b"0-3", {EVENT_FIELD: b'{"type":"token","index":1}'}),
    ]
    events = until_terminal(entries)
    assert [e["type"] for e in events] == ["token", "done"] and events[0]["logprobs"][0][0][1] == -math.inf


@pytest.mark.parametrize(
    "raw", [b'{"type": "tok', b"5", b'{"index": 0}'], ids=["not-json", "no-dict", "no-type"]
)
def test_an_entry_that_is_not_an_event_ends_the_events_with_an_error(raw):
    entries = [
        (b"0-1", {EVENT_FIELD: b'{"type":"token","index":0}'}),
        (b"0-2", {EVENT_FIELD: raw}),
        (b"0-3", {EVENT_FIELD: b'{"type":"token","index":1}'}),
    ]
    events = until_terminal(entries)
    assert events == [{"type": "token", "index": 0}, NOT_AN_EVENT]
    assert NOT_AN_EVENT["type"] in TERMINAL and NOT_AN_EVENT["code"] == "internal_error"
    assert until_terminal([(b"0-1", {b"other": b"{}"})]) == [NOT_AN_EVENT]  # no event field
