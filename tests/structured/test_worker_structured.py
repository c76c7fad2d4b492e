"""Structured outputs through Redis: a real worker thread with the tiny model against a real redis-server."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import SamplingParams
from tests.helpers.worker_fakes import running_worker
from tests.structured.schemas import SCHEMAS
from worker.client import collect, enqueue
from worker.keys import EVENT_FIELD, Keys

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
K = Keys()


def _job(job_id: str, schema: dict, openai: bool) -> dict:
    job = {"id": job_id, "prompt": "Extract the fields:", "max_tokens": 96, "temperature": 0}
    if openai:
        job["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": schema, "strict": True},
        }
    else:
        job["structured_outputs"] = {"json": schema}
    return job


def test_every_schema_regex_and_choice_through_redis(redis_server, r, llm):
    names = sorted(SCHEMAS)
    with running_worker(llm, redis_server.url):
        for i, name in enumerate(names):
            enqueue(r, _job(f"j{i}", SCHEMAS[name], openai=i % 2 == 0))
        enqueue(
            r,
            {
                "id": "re",
                "prompt": "x",
                "max_tokens": 32,
                "structured_outputs": {"regex": "[0-9]{3}-[a-z]{2}"},
            },
        )
        enqueue(
            r,
            {
                "id": "ch",
                "prompt": "x",
                "max_tokens": 32,
                "structured_outputs": {"choice": ["left", "right"]},
            },
        )
        results = {
            job_id: collect(r, job_id, timeout_s=240)[-1]
            for job_id in [f"j{i}" for i in range(len(names))] + ["re", "ch"]
        }
    for i, name in enumerate(names):
        done = results[f"j{i}"]
        assert done["type"] == "done" and done["finish_reason"] == "stop", (name, done)
        jsonschema.validate(json.loads(done["text"]), SCHEMAS[name])
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", results["re"]["text"])
    assert results["ch"]["text"] in ("left", "right")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"structured_outputs": {"json": {"type": "nope"}}}, "nope"),
        ({"structured_outputs": {"regex": "(ab"}}, "parenthesis"),
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
        ({"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens"),
    ],
)
def test_bad_constraints_get_invalid_params(redis_server, r, llm, fields, message):
    with running_worker(llm, redis_server.url) as worker:
        enqueue(r, {"id": "bad", "prompt": "x", **fields})
        events = collect(r, "bad", timeout_s=120)
        assert not worker.engine.has_unfinished_requests()
    assert [e["type"] for e in events] == ["error"]
    assert events[0]["code"] == "invalid_params" and message in events[0]["message"]


def test_takeover_resumes_a_constrained_job_from_its_published_tokens(redis_server, r, llm):
    """The first worker published 6 tokens and died; the next one replays them through the grammar."""
    schema = SCHEMAS["defs_ref"]
    engine = llm
    params = SamplingParams(max_tokens=96, temperature=0, structured_outputs={"json": schema})
    full = engine.generate(["Extract the fields:"], params)[0]
    prior = full.token_ids[:6]
    text = engine.tokenizer.decode(prior)
    r.xadd(
        K.out("t1"),
        {EVENT_FIELD: json.dumps({"type": "token", "index": 0, "token_ids": prior, "text": text})},
        id="0-1",
    )
    with running_worker(engine, redis_server.url):
        enqueue(r, _job("t1", schema, openai=False))
        events = collect(r, "t1", timeout_s=120)
    tokens = [t for e in events if e["type"] == "token" for t in e["token_ids"]]
    assert tokens == full.token_ids and events[-1]["type"] == "done"
    jsonschema.validate(json.loads(events[-1]["text"]), schema)
