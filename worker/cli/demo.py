"""`conveyor demo`: one whole local round with no Docker (and, with `--model tiny`, no internet).

Fetches the built-in real model once (or, with `--model tiny`, makes the tiny random one) in the cache folder,
uses the redis-server answering at the URL or starts one (with --cluster: the Redis Cluster there, or a local
3-master one), runs a worker on a thread, enqueues a few jobs (chat questions for a real model) and prints
their tokens side by side as they arrive (one column per job, demo_columns.py), then a throughput line.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import click
import redis
from redis.exceptions import RedisClusterException

from worker import local_redis
from worker.cli import demo_columns
from worker.cli.tiny_model import resolve_model
from worker.cluster.shard_keys import ShardedKeys
from worker.config import CLUSTER_SHARDS, WorkerConfig
from worker.connection import connect
from worker.job_queue import Cursor, JobQueue, ShardedQueue, SingleQueue, read_outputs
from worker.keys import EVENT_FIELD, Keys

PROMPTS = [  # for the tiny random model: completed, not answered
    "Once upon a time",
    "The quick brown fox",
    "Redis streams are",
    "In a galaxy far away",
    "def main():",
]
QUESTIONS = [  # for a real (chat) model: asked as chat messages
    "What is the capital of France?",
    "Give me three tips for sleeping well.",
    "Write a haiku about the sea.",
    "What is a prime number?",
    "Why is the sky blue?",
]


def run_demo(
    redis_url: str,
    jobs: int,
    max_tokens: int,
    model: str,
    cluster: bool = False,
    shards: int | None = None,
    replicas: int = 0,
) -> None:
    """With `cluster`, the URL is a Redis Cluster node (or a local 3-master cluster is started) and the jobs
    go through protocol version 2's shards to a worker with a lane per shard; with `shards` alone, through that many
    shards of one Redis to a worker with a lane per shard."""
    from engine import LLMEngine
    from worker.cli import logs

    logs.configure("warning", json=False)  # the columns are the show; warnings still appear

    tiny = model.startswith("tiny")
    click.echo(model_line(model))
    model = resolve_model(model)
    prefix = f"conveyor-demo-{int(time.time())}"
    engine = LLMEngine(model, num_kv_blocks=512, max_num_seqs=16)
    with ExitStack() as stack:
        if cluster:
            sharded = ShardedKeys(prefix, shards or CLUSTER_SHARDS)
            queue, worker = _on_a_cluster(stack, redis_url, engine, sharded, replicas)
        else:
            queue, worker = _on_one_redis(stack, redis_url, engine, Keys(prefix=prefix), shards)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()

        @stack.callback
        def stop_worker() -> None:
            worker.stop.request()
            thread.join(timeout=30)

        ids = [f"demo-{k}" for k in range(jobs)]
        start = time.perf_counter()
        cursors = {}
        for k, job_id in enumerate(ids):
            job: dict[str, Any] = {"id": job_id, "max_tokens": max_tokens, "seed": k, "temperature": 0.8}
            if tiny:
                job["prompt"] = PROMPTS[k % len(PROMPTS)]
            else:  # greedy: a small model answers best at temperature 0
                job["messages"] = [{"role": "user", "content": QUESTIONS[k % len(QUESTIONS)]}]
                job["temperature"] = 0.0
            shard = queue.submit(job)
            cursors[queue.keys(shard).out(job_id)] = Cursor(shard)
        texts, tokens = _stream_side_by_side(queue, cursors, ids)
        elapsed = time.perf_counter() - start
        click.echo(
            f"\n{jobs} jobs, {tokens} tokens in {elapsed:.2f} s: {tokens / elapsed:.1f} tokens/s through Redis"
        )


def model_line(spec: str) -> str:
    """One line: which model runs, and for the built-in tiny one that its text means nothing."""
    if spec == "tiny" or spec.startswith("tiny:"):
        return (
            f"model: {spec}, the built-in tiny model (made on first use under the cache folder); its weights "
            "are random, so its text is random tokens"
        )
    return f"model: {spec} (fetched once into the cache folder)"


def _on_one_redis(
    stack: ExitStack, redis_url: str, engine, keys: Keys, shards: int | None
) -> tuple[JobQueue, Any]:
    from worker.run.build import build

    if not local_redis.answers(redis_url):
        server = local_redis.start()
        stack.callback(server.stop)
        redis_url = server.url
        click.echo(f"redis: started a local redis-server at {redis_url}")
    else:
        click.echo(f"redis: using {redis_url}")
    client = connect(redis_url)
    stack.callback(_delete_demo_keys, client, keys.prefix)
    cfg = WorkerConfig(group="demo", consumer="demo-worker", keys=keys, shards=shards)
    queue = (
        SingleQueue(client, keys)
        if shards is None
        else ShardedQueue(client, ShardedKeys(keys.prefix, shards))
    )
    return queue, build(engine, connect(redis_url), cfg)


def _on_a_cluster(
    stack: ExitStack, redis_url: str, engine, sharded: ShardedKeys, replicas: int
) -> tuple[JobQueue, Any]:
    from worker.cluster import local_cluster
    from worker.cluster.client import ClusterClient
    from worker.cluster.connect import connect_cluster
    from worker.run.build import build

    if not local_redis.answers(redis_url):
        folder = Path(tempfile.mkdtemp(prefix="conveyor-demo-cluster-"))
        started = local_cluster.start(folder, masters=3, replicas=0)
        stack.callback(started.stop)
        started.spread_shards([keys.requests for keys in sharded.all()])  # 8 shards fall 2/2/4 otherwise
        redis_url = started.url
        click.echo(f"redis: started a local 3-master Redis Cluster at {redis_url}")
    else:
        click.echo(f"redis: using the Redis Cluster at {redis_url}")
    try:
        client = ClusterClient(connect_cluster(redis_url), sharded, replicas=replicas)
    except (RedisClusterException, redis.ConnectionError) as exc:
        raise click.ClickException(f"cannot use the Redis Cluster at --redis-url: {exc}") from exc
    stack.callback(client.close)
    stack.callback(_delete_demo_keys, client.cluster, sharded.prefix)
    cfg = WorkerConfig(
        group="demo",
        consumer="demo-worker",
        keys=Keys(prefix=sharded.prefix),
        cluster=True,
        shards=sharded.shards,
    )
    return client, build(engine, connect_cluster(redis_url), cfg)


def _delete_demo_keys(client, prefix: str) -> None:
    # One key at a time: in a cluster the demo's keys are spread over the shards' slots.
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)


def _stream_side_by_side(
    queue: JobQueue, cursors: dict[str, Cursor], ids: list[str]
) -> tuple[dict[str, str], int]:
    width = demo_columns.column_width(shutil.get_terminal_size().columns, len(ids))
    texts = dict.fromkeys(ids, "")
    open_streams, tokens, shown = dict(cursors), 0, 0
    click.echo(demo_columns.row(list(ids), width))
    while open_streams:
        for key, entries in read_outputs(queue, open_streams, block_ms=5000):
            job_id = key.rsplit(":", 1)[-1]
            for entry_id, fields in entries:
                open_streams[key].last_id = entry_id
                event = json.loads(fields[EVENT_FIELD])
                if event["type"] == "token":
                    texts[job_id] += event["text"]
                    tokens += len(event["token_ids"])
                else:
                    del open_streams[key]
                    break
        # Print the lines of each column that are now complete.
        columns = [demo_columns.wrap(texts[i], width) or [""] for i in ids]
        ready = min(len(c) - 1 for c in columns) if open_streams else max(len(c) for c in columns)
        for row in range(shown, ready):
            click.echo(demo_columns.row([c[row] if row < len(c) else "" for c in columns], width))
        shown = max(shown, ready)
    return texts, tokens
