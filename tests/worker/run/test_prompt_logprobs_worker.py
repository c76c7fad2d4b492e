"""A real worker (tiny model) publishes a job's prompt logprobs once, on its first token event, and a worker
that takes over a half-written job neither publishes them again nor loses the tokens around them."""

from __future__ import annotations

import json

import pytest

from tests.helpers.worker_fakes import real_engine, running_worker
from worker.client import collect, enqueue
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
K = Keys()
PROMPT = [5, 17, 42, 9, 77, 3, 120, 8]


@pytest.fixture(scope="module")
def engine(tiny_model):
    return real_engine(tiny_model, dtype="float32", device="cpu")


def _job(job_id: str) -> dict:
    return {
        "id": job_id,
        "prompt_token_ids": PROMPT,
        "max_tokens": 6,
        "temperature": 0.0,
        "ignore_eos": True,
        "prompt_logprobs": 1,
    }


def _with_prompt(events: list[dict]) -> list[dict]:
    return [e for e in events if "prompt_logprobs" in e]


def test_published_once_on_the_first_token_event(redis_server, r, engine):
    with running_worker(engine, redis_server.url):
        enqueue(r, _job("pl1"))
        events = collect(r, "pl1", timeout_s=60)
    (first,) = _with_prompt(events)
    assert first is events[0] and first["index"] == 0
    listed = first["prompt_logprobs"]
    assert len(listed) == len(PROMPT) and listed[0] is None
    assert [e[0][0] for e in listed[1:]] == PROMPT[1:] and all(len(e) == 2 for e in listed[1:])
    assert len(first["prompt_logprob_tokens"]) == len(PROMPT)
    assert events[-1]["type"] == "done" and events[-1]["usage"]["completion_tokens"] == 6


def test_a_takeover_after_the_first_event_does_not_publish_them_again(redis_server, r, engine):
    """A crashed worker wrote the first token event (with the prompt logprobs) and a pending entry: the
    next one continues at index 1, without a second copy."""
    with running_worker(engine, redis_server.url):
        enqueue(r, _job("ref"))
        whole = collect(r, "ref", timeout_s=60)
    enqueue(r, _job("tk"))
    r.xreadgroup("test", "dead-worker", {K.requests: ">"})
    r.hincrby(K.attempts, "tk", 1)
    r.xadd(K.out("tk"), {"event": json.dumps(whole[0])}, id="0-1")
    with running_worker(engine, redis_server.url, lease_ms=300):
        events = collect(r, "tk", timeout_s=60)
    assert len(_with_prompt(events)) == 1 and events[0] == whole[0]
    assert [e["index"] for e in events[:-1]] == [e["index"] for e in whole[:-1]]
    assert events[-1]["text"] == whole[-1]["text"]
