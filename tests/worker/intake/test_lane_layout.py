"""Priority and tenant lanes (intake/lane_layout.py): the stream each job goes to, the layout on the wire,
the options' parsing, what a lane is charged (fair_share.served_tokens), and the Python client's routing."""

from __future__ import annotations

import json

import pytest

from engine.outputs import StepDelta
from worker import client as client_module
from worker.client import enqueue
from worker.intake.fair_share import served_tokens
from worker.intake.lane_layout import (
    LaneLayout,
    lane_weights,
    parse_levels,
    parse_weights,
    priority_layout,
    read_layout,
    read_layout_async,
    tenant_layout,
    write_layout,
)
from worker.keys import JOB_FIELD, Keys


def test_a_job_goes_to_the_largest_level_not_above_its_priority():
    layout = priority_layout(Keys(), [10, 0, -5])
    assert layout.levels == [-5, 0, 10]
    stream = {p: layout.stream_for({"id": "j", "priority": p}) for p in (-9, -5, -1, 0, 9, 10, 99)}
    assert stream == {
        -9: "conveyor:requests:p-5",  # below the first level: the first
        -5: "conveyor:requests:p-5",
        -1: "conveyor:requests:p-5",
        0: "conveyor:requests",  # the level of priority 0 reads the requests stream itself
        9: "conveyor:requests",
        10: "conveyor:requests:p10",
        99: "conveyor:requests:p10",
    }
    assert layout.stream_for({"id": "j"}) == "conveyor:requests"  # no priority: 0


def test_every_tenant_has_a_lane_of_its_own_and_jobs_without_one_share_the_default_lane():
    layout = tenant_layout(Keys(prefix="q"), ["a", "default", "b"])
    assert layout.tenants == ["a", "b"] and layout.open
    assert layout.streams == ["q:requests", "q:requests:t:a", "q:requests:t:b"]
    jobs = [{"id": "1"}, {"id": "2", "tenant": "a"}, {"id": "3", "tenant": "zz"}, {"id": "4", "tenant": "b"}]
    assert [layout.lane_of(j) for j in jobs] == [0, 1, 0, 2]  # the named lanes (zz's is not one of them)
    assert [layout.stream_for(j) for j in jobs] == [
        "q:requests",
        "q:requests:t:a",
        "q:requests:t:zz",
        "q:requests:t:b",
    ]
    assert [layout.unnamed_tenant(j) for j in jobs] == [None, None, "zz", None]
    assert layout.tenants_key == "q:requests:tenants"
    for odd in ("default", "a:b", "x" * 65, 7):  # the default lane; a tenant the workers would refuse
        assert layout.stream_for({"id": "5", "tenant": odd}) == "q:requests"
    closed = layout.model_copy(update={"open": False})  # a layout an older worker wrote
    assert closed.stream_for({"id": "3", "tenant": "zz"}) == "q:requests"
    assert lane_weights(layout, {"a": 3.0, "default": 2.0}) == [2.0, 3.0, 1.0]
    with pytest.raises(ValueError):
        tenant_layout(Keys(), ["default"])


def test_lanes_share_the_jobs_keys_and_rename_only_the_stream():
    lanes = priority_layout(Keys(), [0, 10]).lanes(Keys(), "g")
    assert [lane.stream for lane in lanes] == ["conveyor:requests", "conveyor:requests:p10"]
    assert {lane.keys.out("j") for lane in lanes} == {"conveyor:out:j"}
    assert {lane.keys.dead for lane in lanes} == {"conveyor:dead"}


def test_the_layout_round_trips_as_json_and_readers_ignore_unknown_fields():
    layout = priority_layout(Keys(), [0, 10])
    wire = json.loads(layout.model_dump_json())
    assert wire == {
        "v": 1,
        "by": "priority",
        "levels": [0, 10],
        "tenants": [],
        "streams": ["conveyor:requests", "conveyor:requests:p10"],
        "open": False,
    }
    assert LaneLayout.model_validate_json(json.dumps({**wire, "later": 1})) == layout
    with pytest.raises(ValueError):
        LaneLayout.model_validate({**wire, "streams": ["conveyor:requests"]})


def test_options_parse_or_say_what_is_wrong():
    assert parse_levels("10, 0") == [0, 10]
    for bad in ("0", "0,0", "a,1", ""):
        with pytest.raises(ValueError):
            parse_levels(bad)
    assert parse_weights(["a=3", "b", "default=0.5"]) == {"a": 3.0, "b": 1.0, "default": 0.5}
    for bad in (["a=0"], ["a=-1"], ["a=x"], ["a:b=1"], ["=1"]):
        with pytest.raises(ValueError):
            parse_weights(bad)


def _delta(first_index: int, new: int, prompt: int, sample: int = 0) -> StepDelta:
    return StepDelta("r", sample, [7] * new, "", first_index, num_prompt_tokens=prompt)


def test_a_lane_is_charged_completion_tokens_and_each_prompt_once():
    assert served_tokens([_delta(0, 1, 30)]) == 31  # first token: the prompt with it
    assert served_tokens([_delta(1, 1, 30), _delta(2, 3, 30)]) == 4  # later tokens only
    assert served_tokens([_delta(0, 1, 30, sample=1)]) == 1  # n > 1: the prompt is paid by sample 0
    assert served_tokens([_delta(5, 1, 40)]) == 1  # resumed: its prompt was charged before
    assert served_tokens([_delta(0, 0, 30)]) == 0


@pytest.mark.redis
def test_the_client_adds_each_job_to_its_lane_once_the_workers_wrote_a_layout(r, monkeypatch):
    keys = Keys()
    enqueue(r, {"id": "before", "priority": 10}, keys)
    assert r.xlen("conveyor:requests") == 1  # no layout: the requests stream, as always
    write_layout(r, keys, priority_layout(keys, [0, 10]))
    assert read_layout(r, keys) == priority_layout(keys, [0, 10])
    monkeypatch.setattr(client_module, "LAYOUT_TTL_S", 0.0)  # the cached "no layout" is read again
    enqueue(r, {"id": "high", "priority": 10}, keys)
    enqueue(r, {"id": "low"}, keys)
    ((_, high),) = r.xrange("conveyor:requests:p10")
    assert json.loads(high[JOB_FIELD])["id"] == "high"
    assert r.xlen("conveyor:requests") == 2


@pytest.mark.redis
def test_the_client_reads_the_layout_at_most_once_per_ttl(r):
    keys = Keys(prefix="ttl")
    write_layout(r, keys, tenant_layout(keys, ["a"]))
    enqueue(r, {"id": "1", "tenant": "a"}, keys)
    r.delete(keys.lane_layout)  # within the TTL the client still routes by what it read
    enqueue(r, {"id": "2", "tenant": "a"}, keys)
    assert r.xlen("ttl:requests:t:a") == 2


@pytest.mark.redis
def test_an_async_client_reads_the_same_layout(r, redis_server):
    import asyncio

    import redis.asyncio

    keys = Keys(prefix="async")
    layout = tenant_layout(keys, ["a", "b"])

    async def read():
        client = redis.asyncio.Redis.from_url(redis_server.url)
        try:
            return await read_layout_async(client, keys)
        finally:
            await client.aclose()

    assert asyncio.run(read()) is None
    write_layout(r, keys, layout)
    found = asyncio.run(read())
    assert found == layout and found.stream_for({"id": "j", "tenant": "b"}) == "async:requests:t:b"
