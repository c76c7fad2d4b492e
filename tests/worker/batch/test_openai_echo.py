"""A Batch line's echo / prompt_logprobs: the job it becomes, and the answer line built from its events."""

from __future__ import annotations

import json

import pytest

from worker.batch.openai_echo import PromptScores
from worker.batch.openai_input import LineError, parse_line
from worker.batch.openai_logprobs import SampleLogprobs
from worker.batch.openai_output import from_event


def _line(url: str, **body) -> str:
    return json.dumps({"custom_id": "c", "method": "POST", "url": url, "body": {"model": "m", **body}})


FIRST = {
    "type": "token",
    "index": 0,
    "token_ids": [9],
    "text": "!",
    "logprobs": [[[9, -0.25], [9, -0.25]]],
    "logprob_tokens": [["!", "!"]],
    "prompt_logprobs": [None, [[4, -2.0], [6, -1.0]]],
    "prompt_logprob_tokens": [["Hi"], [" you", " me"]],
}
DONE = {
    "type": "done",
    "finish_reason": "length",
    "text": "!",
    "usage": {"prompt_tokens": 2, "completion_tokens": 1},
}


def _answer(request, events) -> dict:
    logprobs: dict[int, SampleLogprobs] = {}
    for e in events[:-1]:
        logprobs.setdefault(0, SampleLogprobs()).add(e)
    scores = PromptScores.of(events[0])
    line, ok, _ = from_event("c", request.url, "m", "j", events[-1], logprobs, request.echo, scores)
    assert ok
    return json.loads(line)["response"]["body"]


def test_echo_with_max_tokens_0_asks_for_the_prompt_and_shows_only_it():
    request = parse_line(_line("/v1/completions", prompt="Hi you", echo=True, logprobs=1, max_tokens=0))
    assert request.job["prompt_logprobs"] == 1 and request.job["max_tokens"] == 1
    body = _answer(request, [FIRST, DONE])
    choice = body["choices"][0]
    assert choice["text"] == "Hi you" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {
        "tokens": ["Hi", " you"],
        "token_logprobs": [None, -2.0],
        "top_logprobs": [None, {" me": -1.0}],
        "text_offset": [0, 2],
    }
    assert body["usage"]["completion_tokens"] == 0


def test_echo_puts_the_prompt_before_the_completion():
    request = parse_line(_line("/v1/completions", prompt="Hi you", echo=True, logprobs=1, max_tokens=1))
    choice = _answer(request, [FIRST, DONE])["choices"][0]
    assert choice["text"] == "Hi you!"
    assert choice["logprobs"]["tokens"] == ["Hi", " you", "!"]
    assert choice["logprobs"]["text_offset"] == [0, 2, 6]


def test_vllm_prompt_logprobs_on_their_own():
    request = parse_line(_line("/v1/completions", prompt=[1, 4], prompt_logprobs=1, max_tokens=1))
    assert request.job["prompt_logprobs"] == 1
    choice = _answer(request, [FIRST, DONE])["choices"][0]
    assert choice["text"] == "!"
    assert choice["prompt_logprobs"] == [
        None,
        {
            "4": {"logprob": -2.0, "rank": None, "decoded_token": " you"},
            "6": {"logprob": -1.0, "rank": 1, "decoded_token": " me"},
        },
    ]


@pytest.mark.parametrize(
    ("url", "body", "message"),
    [
        ("/v1/completions", {"prompt": "x", "max_tokens": 0}, "max_tokens 0 needs echo"),
        ("/v1/completions", {"prompt": "x", "echo": "yes"}, "echo must be a boolean"),
        ("/v1/completions", {"prompt": "x", "prompt_logprobs": 21}, "prompt_logprobs must be"),
        ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "echo": True}, "echo"),
    ],
)
def test_refused(url, body, message):
    with pytest.raises(LineError, match=message):
        parse_line(_line(url, **body))
