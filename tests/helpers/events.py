"""Output stream events for tests, typed as the gateway and the batch runner read them (protocol.parse_event)."""

from __future__ import annotations

import json

from worker.protocol import DoneEvent, Event, parse_event

TIMING = {"queue_ms": 0.0, "ttft_ms": 1.0, "total_ms": 2.0}


def as_event(fields: dict) -> Event:
    """`fields` as a worker writes them, read back through the schema (a done event's missing text,
    timing and usage filled in)."""
    if fields.get("type") == "done":
        usage = {"prompt_tokens": 1, "completion_tokens": 1, **fields.get("usage", {})}
        fields = {"text": "", "timing": TIMING, **fields, "usage": usage}
    return parse_event(json.dumps(fields))


def done(reason: str = "length", **fields) -> DoneEvent:
    event = as_event({"type": "done", "finish_reason": reason, **fields})
    assert isinstance(event, DoneEvent)
    return event
