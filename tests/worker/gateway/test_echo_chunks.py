"""Streamed completions with echo / prompt_logprobs: each choice's first chunk holds the echoed prompt, the
completion's text offsets continue after it, and with max_tokens 0 the generated token is never shown."""

from __future__ import annotations

import json

from tests.helpers.events import as_event
from worker.gateway.chunks import ChunkEncoder
from worker.openai.echo import take_echo
from worker.openai.request import COMPLETIONS_URL

FIRST = {
    "type": "token",
    "index": 0,
    "token_ids": [9],
    "text": "!",
    "logprobs": [[[9, -0.25]]],
    "logprob_tokens": [["!"]],
    "prompt_logprobs": [None, [[4, -2.0], [6, -1.0]]],
    "prompt_logprob_tokens": [["Hi"], [" you", " me"]],
}
SECOND = {**FIRST, "sample": 1}
for key in ("prompt_logprobs", "prompt_logprob_tokens"):
    SECOND.pop(key)
DONE = {
    "type": "done",
    "finish_reason": "length",
    "text": "!",
    "texts": ["!", "!"],
    "finish_reasons": ["length", "length"],
    "usage": {"prompt_tokens": 2, "completion_tokens": 2},
    "timing": {"queue_ms": 0.0, "ttft_ms": 1.0, "total_ms": 2.0},
}


def _chunks(body: dict, events: list[dict]) -> list[dict]:
    job = {"prompt": body["prompt"], "max_tokens": body["max_tokens"], "logprobs": body.get("logprobs")}
    echo = take_echo(dict(body), job)
    writer = ChunkEncoder(COMPLETIONS_URL, "j", "tiny", 2, True, 30.0, created=1, echo=echo)
    raw, last = writer.body([as_event(event) for event in events], first=True)
    assert last
    out = []
    for part in raw.decode().split("\n\n"):
        payload = part.removeprefix("data: ")
        if payload and payload != "[DONE]":
            out.append(json.loads(payload))
    assert all(chunk["object"] == "text_completion" for chunk in out)
    return out


def _choices(chunks: list[dict], k: int) -> list[dict]:
    return [c for chunk in chunks for c in chunk["choices"] if c["index"] == k]


def test_every_choice_starts_with_the_prompt_and_offsets_continue_after_it():
    chunks = _chunks(
        {"prompt": "Hi you", "max_tokens": 1, "echo": True, "logprobs": 1}, [FIRST, SECOND, DONE]
    )
    for k in (0, 1):
        choices = _choices(chunks, k)
        assert "".join(c["text"] for c in choices) == "Hi you!"
        offsets = [o for c in choices if c["logprobs"] for o in c["logprobs"]["text_offset"]]
        assert offsets == [0, 2, 6]
        assert choices[0]["logprobs"]["token_logprobs"] == [None, -2.0]


def test_max_tokens_0_shows_the_prompt_only():
    chunks = _chunks({"prompt": "Hi you", "max_tokens": 0, "echo": True}, [FIRST, SECOND, DONE])
    for k in (0, 1):
        choices = _choices(chunks, k)
        assert "".join(c["text"] for c in choices) == "Hi you"
        assert choices[-1]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == 0


def test_prompt_logprobs_without_echo_come_on_the_first_chunk():
    chunks = _chunks({"prompt": [1, 4], "max_tokens": 1, "prompt_logprobs": 0}, [FIRST, SECOND, DONE])
    first = _choices(chunks, 0)[0]
    assert first["text"] == "" and first["prompt_logprobs"][0] is None
    assert first["prompt_logprobs"][1]["4"]["logprob"] == -2.0
    assert "".join(c["text"] for c in _choices(chunks, 1)) == "!"
