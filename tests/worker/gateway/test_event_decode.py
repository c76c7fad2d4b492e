"""An output stream's entries are read through the wire schema (protocol.parse_event): the worker's events
come back as they were written, -Infinity logprobs included; an entry that is not an event ends its
answer with NOT_AN_EVENT, a 500."""

from __future__ import annotations

import json
import math

import pytest

from tests.helpers.events import TIMING
from worker.gateway.job_io import until_terminal
from worker.keys import EVENT_FIELD
from worker.protocol import NOT_AN_EVENT, TERMINAL, DoneEvent, TokenEvent

TOKEN = {
    "type": "token",
    "index": 3,
    "token_ids": [17],
    "text": ' caf\u00e9 \u2603 "q" \\',
    "logprobs": [[[17, -0.5], [9, -math.inf]]],  # a token that cannot be sampled: -inf, written -Infinity
    "logprob_tokens": [[" caf", "x"]],
}
DONE = {
    "type": "done",
    "finish_reason": "length",
    "text": "t",
    "usage": {"prompt_tokens": 4, "completion_tokens": 1},
    "timing": TIMING,
}


def _entry(k: int, raw: bytes) -> tuple[bytes, dict]:
    return b"0-%d" % k, {EVENT_FIELD: raw}


def _raw(event: dict) -> bytes:
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()  # as the worker writes it


def test_until_terminal_reads_each_entry_as_written_and_stops_at_the_terminal_one():
    assert b"-Infinity" in _raw(TOKEN)
    events = until_terminal([_entry(1, _raw(TOKEN)), _entry(2, _raw(DONE)), _entry(3, _raw(TOKEN))])
    assert [type(e) for e in events] == [TokenEvent, DoneEvent]
    token = events[0]
    assert isinstance(token, TokenEvent) and token.text == TOKEN["text"]
    assert token.logprobs == [[(17, -0.5), (9, -math.inf)]]


@pytest.mark.parametrize(
    "raw",
    [b'{"type": "tok', b"5", b'{"index": 0}', b'{"type":"token","index":0}', b"[" * 5000 + b"]" * 5000],
    ids=["not-json", "no-dict", "no-type", "not-the-schema", "5000-deep"],
)
def test_an_entry_that_is_not_an_event_ends_the_events_with_an_error(raw):
    events = until_terminal([_entry(1, _raw(TOKEN)), _entry(2, raw), _entry(3, _raw(TOKEN))])
    assert events[1:] == [NOT_AN_EVENT] and isinstance(events[0], TokenEvent)
    assert NOT_AN_EVENT.type in TERMINAL and NOT_AN_EVENT.code == "internal_error"
    assert until_terminal([(b"0-1", {b"other": b"{}"})]) == [NOT_AN_EVENT]  # no event field
