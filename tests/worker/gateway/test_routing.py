"""Where the gateway adds a job: the rules every client follows (worker/shard_choice.py), over the streams the
model's live workers read; the shard's keys for its output; the fleet dashboard mounted at /dashboard."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from worker.affinity_key import with_affinity
from worker.cluster.shard_keys import ShardedKeys
from worker.fleet.heartbeat import Heartbeat
from worker.gateway.app import create_app
from worker.gateway.fleet_view import ServedModel
from worker.gateway.job_io import keys_of_stream
from worker.gateway.settings import GatewaySettings
from worker.intake.lane_layout import priority_layout, tenant_layout
from worker.keys import Keys
from worker.shard_choice import choose_shard


def served(streams: list[str]) -> ServedModel:
    record = Heartbeat(
        None, Keys(), consumer="w", model="m", group="m", streams=streams, max_model_len=64, capacity=4
    ).record
    return ServedModel("m", [record])


def test_one_stream_takes_every_job():
    model = served(["conveyor:requests:m"])
    assert model.layout_keys("conveyor") is None
    assert model.stream_for({"id": "a"}, "conveyor", None) == "conveyor:requests:m"


def test_shards_are_chosen_by_the_affinity_key_as_clients_choose_them():
    sharded = ShardedKeys("conveyor", 4)
    model = served([k.requests for k in sharded.all()])
    assert model.layout_keys("conveyor") is None
    prompt = "You are a helpful assistant. " * 20
    jobs = [with_affinity({"id": f"j{k}", "prompt": prompt + str(k)}) for k in range(12)]
    shards = {model.stream_for(job, "conveyor", None) for job in jobs}
    assert shards == {sharded.shard(choose_shard(jobs[0], 4)).requests}  # one shared prefix: one shard
    keyless = {"id": "solo", "prompt_token_ids": [1, 2]}
    assert model.stream_for(keyless, "conveyor", None) == sharded.shard(choose_shard(keyless, 4)).requests


def test_priority_and_tenant_lanes_follow_the_workers_layout():
    keys = Keys()
    by_priority = priority_layout(keys, [0, 10])
    model = served(by_priority.streams)
    assert model.layout_keys("conveyor").lane_layout == keys.lane_layout
    assert model.stream_for({"id": "a", "priority": 10}, "conveyor", by_priority) == by_priority.streams[1]
    assert model.stream_for({"id": "b"}, "conveyor", by_priority) == keys.requests
    by_tenant = tenant_layout(keys, ["acme"])
    model = served(by_tenant.streams)
    assert model.stream_for({"id": "c", "tenant": "acme"}, "conveyor", by_tenant) == by_tenant.streams[1]
    # A tenant not named has a lane of its own (the layout is open); no tenant: the default lane.
    assert (
        model.stream_for({"id": "d", "tenant": "other"}, "conveyor", by_tenant) == "conveyor:requests:t:other"
    )
    assert model.stream_for({"id": "e"}, "conveyor", by_tenant) == keys.requests


def test_a_shard_streams_output_is_read_under_the_shards_keys():
    keys = Keys()
    shard = ShardedKeys("conveyor", 8).shard(5)
    assert keys_of_stream(keys, shard.requests).out("j") == shard.out("j")
    assert keys_of_stream(keys, "conveyor:requests:m") is keys


@pytest.mark.redis
def test_the_dashboard_is_mounted_on_the_gateway(redis_server):
    with TestClient(create_app(GatewaySettings(redis_url=redis_server.url))) as http:
        page = http.get("/dashboard/")
        assert page.status_code == 200 and "uPlot" in page.text
        snapshot = http.get("/dashboard/api/snapshot")
        assert snapshot.status_code == 200 and "models" in snapshot.json()
