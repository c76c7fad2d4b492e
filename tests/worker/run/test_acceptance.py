"""Issue #4 acceptance, in process: the real LLMEngine on the tiny model against a real redis-server."""

from __future__ import annotations

import json
import threading
import time

import pytest

from tests.helpers.worker_fakes import real_engine, running_worker, wait_until
from worker.client import collect, enqueue
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]
K = Keys()


def tokens_of(events, sample=None):
    return [t for e in events if e["type"] == "token" and e.get("sample") == sample for t in e["token_ids"]]


def text_of(events):
    return "".join(e["text"] for e in events if e["type"] == "token")


@pytest.mark.parametrize(
    "params",
    [{"temperature": 0.0, "max_tokens": 20}, {"temperature": 0.9, "seed": 11, "max_tokens": 16, "top_k": 50}],
)
def test_deltas_concatenate_to_generate(redis_server, r, tiny_model, params):
    from engine import SamplingParams

    direct = real_engine(tiny_model).generate(["The worker says"], SamplingParams(**params))[0]
    with running_worker(real_engine(tiny_model), redis_server.url):
        enqueue(r, {"id": "g1", "prompt": "The worker says", **params})
        events = collect(r, "g1", timeout_s=60)
    done = events[-1]
    assert done["type"] == "done"
    assert text_of(events) == direct.text == done["text"]
    assert tokens_of(events) == direct.token_ids
    assert [e["index"] for e in events[:-1]] == sorted(e["index"] for e in events[:-1])
    assert done["usage"] == {
        "prompt_tokens": len(direct.prompt_token_ids),
        "completion_tokens": len(direct.token_ids),
    }
    assert done["timing"]["total_ms"] >= done["timing"]["ttft_ms"] >= done["timing"]["queue_ms"] >= 0


def test_late_subscriber_replays_and_live_subscriber_sees_the_same(redis_server, r, tiny_model):
    pubsub = r.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(K.out("p1"))
    live: list[dict] = []

    def listen():
        for message in pubsub.listen():
            live.append(json.loads(message["data"]))
            if live[-1]["type"] in ("done", "error"):
                return

    listener = threading.Thread(target=listen, daemon=True)
    listener.start()
    with running_worker(real_engine(tiny_model), redis_server.url):
        enqueue(
            r,
            {"id": "p1", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 12, "temperature": 0},
        )
        listener.join(timeout=60)
        wait_until(lambda: r.xpending(K.requests, "test")["pending"] == 0, 10, "the terminal ack")
    replay = collect(r, "p1", timeout_s=5)  # subscribes after the end: still sees everything
    assert replay == live and replay[-1]["type"] in ("done", "error")


def test_cancel_mid_generation_frees_blocks(redis_server, r, tiny_model):
    engine = real_engine(tiny_model)
    with running_worker(engine, redis_server.url):
        enqueue(
            r, {"id": "c1", "prompt": "cancel me", "max_tokens": 1500, "ignore_eos": True, "temperature": 0}
        )
        wait_until(lambda: r.xlen(K.out("c1")) >= 3, 60, "first tokens")
        assert engine.stats().num_kv_blocks_used > 0
        r.publish(K.cancel_channel, "c1")
        events = collect(r, "c1", timeout_s=30)
        assert events[-1]["finish_reason"] == "abort" and events[-1]["reason"] == "cancel"
        assert events[-1]["usage"]["completion_tokens"] < 1500
        assert engine.stats().num_kv_blocks_used == 0 and not engine.has_unfinished_requests()


def test_deadline_past_refused_near_future_stops(redis_server, r, tiny_model):
    # The near deadline counts from when the worker is seen reading (its answer to "late"): a slow start
    # on a loaded machine cannot use up the window.
    with running_worker(real_engine(tiny_model), redis_server.url):
        enqueue(r, {"id": "late", "prompt": "x", "deadline_ms": int(time.time() * 1000) - 1000})
        assert collect(r, "late", timeout_s=30)[-1]["code"] == "deadline_exceeded"
        soon = {"id": "soon", "prompt": "x", "max_tokens": 1500, "ignore_eos": True}
        enqueue(r, {**soon, "deadline_ms": int(time.time() * 1000) + 1000})
        done = collect(r, "soon", timeout_s=30)[-1]
    assert done["finish_reason"] == "abort" and done["reason"] == "deadline"
    assert done["usage"]["completion_tokens"] < 1500


def test_bad_input_then_still_serving(redis_server, r, tiny_model):
    from worker.intake.limits import Limits

    bad = {
        b"\x80\x81 binary": None,
        b'{"id": "e1", "prompt": 5}': "invalid_job",
        b'{"id": "e2", "prompt": "x", "bogus": true}': "unknown_field",
        b'{"id": "e3", "prompt": "' + b"word " * 200 + b'"}': "prompt_too_long",
        b'{"id": "e4", "prompt": "x", "top_p": 0}': "invalid_params",
        b'{"id": "e5", "prompt_token_ids": [1, 100000]}': "rejected",
        b'{"id": "e6", "prompt": "x", "max_tokens": 5000}': "max_tokens_too_large",
        b'{"id": "e7", "prompt": "x", "n": 3, "temperature": 0}': "invalid_params",
    }
    limits = Limits(max_tokens=2000)
    with running_worker(real_engine(tiny_model, max_prompt_tokens=100), redis_server.url, limits=limits):
        for raw in bad:
            r.xadd(K.requests, {b"job": raw})
        enqueue(r, {"id": "ok", "prompt": "fine", "max_tokens": 4, "temperature": 0})
        assert collect(r, "ok", timeout_s=60)[-1]["type"] == "done"
        for raw, code in bad.items():
            if code:
                job_id = json.loads(raw)["id"]
                assert collect(r, job_id, timeout_s=10)[-1]["code"] == code, job_id
    assert r.xlen(K.dead) == len(bad)
    assert r.xpending(K.requests, "test")["pending"] == 0
