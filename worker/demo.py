"""`conveyor demo`: one whole local round with no internet and no Docker.

Makes the tiny model in the cache folder, uses the redis-server answering at the URL or starts one,
runs a worker on a thread, enqueues a few jobs and prints their tokens side by side as they arrive
(one column per job), then a throughput line.
"""

from __future__ import annotations

import json
import shutil
import textwrap
import threading
import time

import click

from worker import local_redis
from worker.config import WorkerConfig
from worker.connection import connect
from worker.keys import EVENT_FIELD, Keys
from worker.tiny import resolve_model

PROMPTS = [
    "Once upon a time",
    "The quick brown fox",
    "Redis streams are",
    "In a galaxy far away",
    "def main():",
]


def run_demo(redis_url: str, jobs: int, max_tokens: int, arch: str) -> None:
    from engine import LLMEngine
    from worker import logs
    from worker.client import enqueue
    from worker.loop import Worker

    logs.configure("warning", json=False)  # the columns are the show; warnings still appear

    click.echo(f"model: tiny {arch} (made on first use under the cache folder)")
    model = resolve_model(f"tiny:{arch}")
    server = None
    if not local_redis.answers(redis_url):
        server = local_redis.start()
        redis_url = server.url
        click.echo(f"redis: started a local redis-server at {redis_url}")
    else:
        click.echo(f"redis: using {redis_url}")
    keys = Keys(prefix=f"conveyor-demo-{int(time.time())}")
    engine = LLMEngine(model, num_kv_blocks=512, max_num_seqs=16)
    worker = Worker(engine, connect(redis_url), WorkerConfig(group="demo", consumer="demo-worker", keys=keys))
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    client = connect(redis_url)
    try:
        ids = [f"demo-{k}" for k in range(jobs)]
        start = time.perf_counter()
        for k, job_id in enumerate(ids):
            prompt = PROMPTS[k % len(PROMPTS)]
            enqueue(
                client,
                {"id": job_id, "prompt": prompt, "max_tokens": max_tokens, "seed": k, "temperature": 0.8},
                keys,
            )
        texts, tokens = _stream_side_by_side(client, keys, ids)
        elapsed = time.perf_counter() - start
        click.echo(
            f"\n{jobs} jobs, {tokens} tokens in {elapsed:.2f} s: {tokens / elapsed:.1f} tokens/s through Redis"
        )
    finally:
        worker.stop.request()
        thread.join(timeout=30)
        for key in client.scan_iter(match=f"{keys.prefix}:*"):
            client.delete(key)
        if server is not None:
            server.stop()


def _stream_side_by_side(client, keys: Keys, ids: list[str]) -> tuple[dict[str, str], int]:
    width = max(12, (shutil.get_terminal_size().columns - 3 * len(ids)) // len(ids))
    texts = dict.fromkeys(ids, "")
    cursors = {keys.out(i): b"0" for i in ids}
    open_ids, tokens, shown = set(ids), 0, 0
    click.echo(" | ".join(i.ljust(width) for i in ids))
    while open_ids:
        reply = client.xread({k: cursors[k] for k in (keys.out(i) for i in open_ids)}, block=5000) or []
        for key, entries in reply:
            job_id = key.decode().rsplit(":", 1)[-1]
            for entry_id, fields in entries:
                cursors[key.decode()] = entry_id
                event = json.loads(fields[EVENT_FIELD])
                if event["type"] == "token":
                    texts[job_id] += event["text"]
                    tokens += len(event["token_ids"])
                else:
                    open_ids.discard(job_id)
        # Print the lines of each column that are now complete.
        columns = [textwrap.wrap(texts[i].replace("\n", " "), width) or [""] for i in ids]
        ready = min(len(c) - 1 for c in columns) if open_ids else max(len(c) for c in columns)
        for row in range(shown, ready):
            click.echo(" | ".join((c[row] if row < len(c) else "").ljust(width) for c in columns))
        shown = max(shown, ready)
    return texts, tokens
