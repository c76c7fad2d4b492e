"""Two models served from one Redis: each has its own request stream (--served-model-name), so each job
runs on a worker of the model it names, and the other model's workers never see it."""

from __future__ import annotations

import openai
import pytest
import redis

from tests.helpers.gateway import greedy, spawn_gateway
from tests.helpers.rel_helpers import Workers
from worker.keys import requests_stream_name

pytestmark = [pytest.mark.redis, pytest.mark.timeout(300)]
ASK = [{"role": "user", "content": "Which model are you?"}]


def test_each_job_runs_on_the_model_it_names(redis_server, tiny_model_dir, tmp_path):
    paths = {"alpha": str(tiny_model_dir("llama")), "beta": str(tiny_model_dir("qwen2"))}
    workers = Workers(paths["alpha"], tmp_path)
    spawned = []
    for name, path in paths.items():
        workers.model = path
        spawned.append(workers.spawn(redis_server.url, f"w-{name}", "--served-model-name", name, group=name))
    gateway = spawn_gateway(redis_server.url, tmp_path)
    try:
        for w in spawned:
            w.wait_started()
        sdk = openai.OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=120)
        assert sorted(m.id for m in sdk.models.list().data) == ["alpha", "beta"]
        runs = {"alpha": 3, "beta": 2}
        for name, count in runs.items():
            want = greedy(paths[name], ASK, 8)
            for _ in range(count):
                got = sdk.chat.completions.create(model=name, messages=ASK, max_tokens=8, temperature=0)
                assert got.choices[0].message.content == want and got.model == name
        assert greedy(paths["alpha"], ASK, 8) != greedy(
            paths["beta"], ASK, 8
        )  # else the check above is blind
        client = redis.Redis.from_url(redis_server.url, decode_responses=True)
        for name, count in runs.items():
            groups = client.xinfo_groups(requests_stream_name("conveyor", name))
            assert [(g["name"], g["entries-read"]) for g in groups] == [(name, count)]
        assert not client.exists("conveyor:requests")  # no job went to the unnamed stream
    finally:
        gateway.stop()
        workers.stop_all()
