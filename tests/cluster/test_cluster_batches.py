"""The HTTP API's batches on a Redis Cluster: the gateway's wiring (worker/gateway/batch_api.py) with
--cluster drives a batch whose jobs go to the streams the model's worker reads (from the registry), spread
over the shards; its Lua calls run on one node ({<batch id>})."""

from __future__ import annotations

import json

import pytest

from tests.cluster.conftest import sharded_worker
from tests.helpers.waiting import wait_until
from tests.helpers.worker_fakes import FakeEngine
from worker.fleet.heartbeat import Heartbeat
from worker.gateway.batch_api import make_batch_api
from worker.gateway.settings import GatewaySettings
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]


def _line(custom_id: str) -> str:
    body = {"model": "m", "prompt": f"prompt {custom_id}", "max_tokens": 4, "seed": 1}
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/completions", "body": body})


def test_a_batch_runs_on_the_cluster(cluster, client):
    engine = FakeEngine()
    settings = GatewaySettings(redis_url=cluster.url, cluster=True, shards=2)
    api = make_batch_api(settings, Keys())
    ids = [f"c{i}" for i in range(10)]
    f = api.files.create("t", "in.jsonl", "batch", "".join(_line(c) + "\n" for c in ids).encode())
    batch = api.batches.create("t", f.id, "/v1/completions", "1h")
    with sharded_worker(engine, cluster.url, "w1", shards=2):
        # The worker's registry record, as `conveyor worker` beats it: the model "m" on both shards' streams.
        streams = [client.sharded.shard(k).requests for k in range(2)]
        beat = Heartbeat(api.client, Keys(), consumer="w1", model="m", group="test", streams=streams,
                         max_model_len=256, capacity=8)  # fmt: skip
        beat.start()
        api.pool.start()
        try:

            def final():
                b = api.batches.get("t", batch.id)
                return b if b is not None and b.status == "completed" else None

            done = wait_until(final, 60, "the batch to complete", 0.05)
        finally:
            api.pool.stop()
            beat.stop()
    assert done.request_counts.completed == len(ids) and done.output_file_id is not None
    content = api.files.content("t", done.output_file_id)
    assert content is not None
    lines = [json.loads(x) for x in content.decode().splitlines()]
    assert sorted(x["custom_id"] for x in lines) == sorted(ids)
    for x in lines:
        text = x["response"]["body"]["choices"][0]["text"]
        assert text == engine.expected_text(f"prompt {x['custom_id']}", 4, seed=1)
    placed = [client.node(k).xlen(client.sharded.shard(k).requests) for k in range(2)]
    assert placed[0] > 0 and placed[1] > 0, placed
