"""Through the real worker loop on a real redis-server and the real engine: an exception while handling one
job ends that job with an `internal_error` event (logged with its id), and the worker and the other jobs of
its batch run on. And issue 20's Korean + emoji sampled jobs on a SentencePiece tokenizer with byte
fallback, which took the worker down (tokenizers' DecodeStream raised out of the engine)."""

from __future__ import annotations

import pytest
from structlog.testing import capture_logs

from tests.helpers.worker_fakes import real_engine, running_worker, wait_until
from worker.client import collect, enqueue
from worker.keys import Keys

pytestmark = pytest.mark.redis
K = Keys()


class _Raising:
    """Wraps one request's TextStream; its third append raises (a test-only fault, set by monkeypatch)."""

    def __init__(self, stream) -> None:
        self.stream, self.calls = stream, 0

    def append(self, ids):
        self.calls += 1
        if self.calls == 3:
            raise RuntimeError("injected fault")
        return self.stream.append(ids)

    def __getattr__(self, name):
        return getattr(self.stream, name)


def test_a_failing_job_ends_alone_with_internal_error(redis_server, r, tiny_model, monkeypatch):
    engine = real_engine(tiny_model)
    add_request = engine.add_request

    def add_with_fault(request_id, *args, **kwargs):
        n = add_request(request_id, *args, **kwargs)
        if request_id == "bad":
            engine._streams["bad"] = _Raising(engine._streams["bad"])
        return n

    monkeypatch.setattr(engine, "add_request", add_with_fault)
    ids = ["ok1", "bad", "ok2"]
    with capture_logs() as logs, running_worker(engine, redis_server.url) as worker:
        for job_id in ids:
            enqueue(
                r,
                {
                    "id": job_id,
                    "prompt": "one bad apple",
                    "max_tokens": 10,
                    "temperature": 0,
                    "ignore_eos": True,
                },
            )
        events = {job_id: collect(r, job_id, timeout_s=60) for job_id in ids}
        wait_until(lambda: r.xpending(K.requests, "test")["pending"] == 0, 10, "every entry acknowledged")
        assert worker.io is not None  # still running: the context manager drains it on exit
    bad = events["bad"][-1]
    assert bad["type"] == "error" and bad["code"] == "internal_error" and "injected fault" in bad["message"]
    for job_id in ("ok1", "ok2"):
        done = events[job_id][-1]
        assert done["type"] == "done" and done["usage"]["completion_tokens"] == 10
        assert "".join(e["text"] for e in events[job_id][:-1]) == done["text"]
    assert any(e["event"] == "request failed" and e.get("request_id") == "bad" for e in logs)
    assert any(e["event"] == "job failed" and e.get("request_id") == "bad" for e in logs)
    assert engine.stats().num_kv_blocks_used == 0


def test_korean_and_emoji_sampled_jobs_all_finish(redis_server, r, tiny_model_dir):
    """Issue 20's row: 20 seeds at temperature 1 on "김치는 맛있습니다 🍜"; the deltas join to the done text."""
    engine = real_engine(str(tiny_model_dir("llama", tokenizer="sentencepiece")))
    ids = [f"ko{seed}" for seed in range(20)]
    with running_worker(engine, redis_server.url):
        for seed, job_id in enumerate(ids):
            job = {"id": job_id, "prompt": "김치는 맛있습니다 🍜", "max_tokens": 16, "temperature": 1.0}
            enqueue(r, {**job, "seed": seed, "ignore_eos": True})
        events = {job_id: collect(r, job_id, timeout_s=120) for job_id in ids}
    for job_id in ids:
        done = events[job_id][-1]
        assert done["type"] == "done", done
        assert "".join(e["text"] for e in events[job_id][:-1]) == done["text"]


def test_a_prompt_that_fails_to_render_ends_alone_with_internal_error(
    redis_server, r, tiny_model, monkeypatch
):
    """Rendering (templating, tokenizing) raising something no template error explains: internal_error."""
    engine = real_engine(tiny_model)
    encode = engine._encode

    def failing(prompt):
        if prompt == "render me badly":
            raise RuntimeError("injected rendering fault")
        return encode(prompt)

    monkeypatch.setattr(engine, "_encode", failing)
    with running_worker(engine, redis_server.url):
        enqueue(r, {"id": "render", "prompt": "render me badly", "max_tokens": 4})
        enqueue(r, {"id": "fine", "prompt": "render me well", "max_tokens": 4})
        bad, fine = collect(r, "render", timeout_s=60), collect(r, "fine", timeout_s=60)
    assert bad[-1]["type"] == "error" and bad[-1]["code"] == "internal_error"
    assert "injected rendering fault" in bad[-1]["message"]
    assert fine[-1]["type"] == "done"
