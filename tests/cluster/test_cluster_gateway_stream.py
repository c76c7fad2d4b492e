"""A streamed answer through `conveyor serve --cluster`: there each request reads its own output stream
(worker/gateway/own_reads.py, as one XREAD cannot span slots) and its chunks go out through the same
EventStream as on one Redis: the text is the engine's, in order, ending with [DONE]."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.cluster.conftest import sharded_worker
from tests.helpers.gateway import spawn_gateway
from tests.helpers.worker_fakes import FakeEngine
from worker.fleet.heartbeat import Heartbeat
from worker.keys import Keys

pytestmark = [pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(180)]


def test_streams_on_the_cluster_carry_the_engines_text(cluster, client, tmp_path):
    engine = FakeEngine()
    gateway = spawn_gateway(cluster.url, tmp_path, "--cluster", "--shards", "2")
    try:
        with sharded_worker(engine, cluster.url, "w1", shards=2):
            streams = [client.sharded.shard(k).requests for k in range(2)]
            beat = Heartbeat(client.cluster, Keys(), consumer="w1", model="m", group="test", streams=streams,
                             max_model_len=256, capacity=8)  # fmt: skip
            beat.start()
            try:
                for i in range(4):  # spread over both shards by their prompts' affinity keys
                    body = {"model": "m", "prompt": f"q{i}", "max_tokens": 5, "seed": i, "stream": True}
                    text, events = "", []
                    with httpx.stream("POST", gateway.base_url + "/completions", json=body, timeout=60) as r:
                        assert r.status_code == 200, r.read()
                        for line in r.iter_lines():
                            if line.startswith("data: "):
                                events.append(line.removeprefix("data: "))
                    assert events[-1] == "[DONE]"
                    chunks = [json.loads(e) for e in events[:-1]]
                    text = "".join(c["choices"][0]["text"] for c in chunks)
                    assert text == engine.expected_text(f"q{i}", 5, seed=i)
                    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
            finally:
                beat.stop()
    finally:
        gateway.stop()
