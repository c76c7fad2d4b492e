"""A completions body's echo / prompt_logprobs: the job it becomes, and the answer built from its events."""

from __future__ import annotations

import pytest

from tests.helpers.events import as_event
from worker.openai.echo import PromptScores
from worker.openai.logprobs import SampleLogprobs
from worker.openai.request import CompletionRequest, RequestError, completion_request
from worker.openai.response import response_body
from worker.protocol import DoneEvent, TokenEvent


def _request(url: str, **body) -> CompletionRequest:
    return completion_request(url, {"model": "m", **body}, "j")


FIRST = as_event(
    {
        "type": "token",
        "index": 0,
        "token_ids": [9],
        "text": "!",
        "logprobs": [[[9, -0.25], [9, -0.25]]],
        "logprob_tokens": [["!", "!"]],
        "prompt_logprobs": [None, [[4, -2.0], [6, -1.0]]],
        "prompt_logprob_tokens": [["Hi"], [" you", " me"]],
    }
)
DONE = as_event(
    {
        "type": "done",
        "finish_reason": "length",
        "text": "!",
        "usage": {"prompt_tokens": 2, "completion_tokens": 1},
    }
)


def _answer(request: CompletionRequest, events: list) -> dict:
    first, done = events[0], events[-1]
    assert isinstance(first, TokenEvent) and isinstance(done, DoneEvent)
    logprobs: dict[int, SampleLogprobs] = {}
    for e in events[:-1]:
        logprobs.setdefault(0, SampleLogprobs()).add(e)
    return response_body(request.url, "m", "j", done, logprobs, request.echo, PromptScores.of(first))


def test_echo_with_max_tokens_0_asks_for_the_prompt_and_shows_only_it():
    request = _request("/v1/completions", prompt="Hi you", echo=True, logprobs=1, max_tokens=0)
    assert request.job.prompt_logprobs == 1 and request.job.max_tokens == 1
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
    request = _request("/v1/completions", prompt="Hi you", echo=True, logprobs=1, max_tokens=1)
    choice = _answer(request, [FIRST, DONE])["choices"][0]
    assert choice["text"] == "Hi you!"
    assert choice["logprobs"]["tokens"] == ["Hi", " you", "!"]
    assert choice["logprobs"]["text_offset"] == [0, 2, 6]


def test_vllm_prompt_logprobs_on_their_own():
    request = _request("/v1/completions", prompt=[1, 4], prompt_logprobs=1, max_tokens=1)
    assert request.job.prompt_logprobs == 1
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
    with pytest.raises(RequestError, match=message):
        _request(url, **body)
