"""What the lanes worker costs on one Redis: the same jobs through one stream (protocol version 1, `Worker`)
and through S shards of the same Redis (`run/build.py`), interleaved, in one run.

    python benchmarks/lanes_one_redis.py --shards 4 --jobs 1500 --runs 2

The engine is tests/helpers' FakeEngine (one letter a step per sequence, no model), so the figure is the
worker's and Redis's own cost per job: every job is queued before the worker starts, and the clock runs
from its start to the last job's terminal event. Prints jobs/s for each layout and sharded / single.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.helpers.worker_fakes import FakeEngine  # noqa: E402
from worker import local_redis  # noqa: E402
from worker.client import enqueue, enqueue_sharded  # noqa: E402
from worker.cluster.shard_keys import ShardedKeys  # noqa: E402
from worker.config import WorkerConfig  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.keys import EVENT_FIELD, Keys  # noqa: E402
from worker.run.build import build  # noqa: E402
from worker.run.loop import Worker  # noqa: E402
from worker.shard_choice import choose_shard  # noqa: E402


def one_run(url: str, shards: int | None, jobs: int, max_tokens: int) -> float:
    r = connect(url)
    r.flushall()
    sharded = ShardedKeys("conveyor", shards) if shards else None
    for i in range(jobs):
        job = {"id": f"j{i}", "prompt": f"p{i % 50}", "max_tokens": max_tokens}
        if sharded is None:
            enqueue(r, job)
        else:
            enqueue_sharded(r, job, sharded)
    engine = FakeEngine(max_num_seqs=64, step_s=0.0)
    cfg = WorkerConfig(group="bench", consumer="w", shards=shards)
    worker = Worker(engine, connect(url), cfg) if sharded is None else build(engine, connect(url), cfg)
    last = f"j{jobs - 1}"
    out = (Keys() if sharded is None else sharded.shard(choose_shard({"id": last}, shards or 1))).out(last)
    start = time.perf_counter()
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    while True:  # jobs run about in queue order: the last one's end is the end
        tail = r.xrevrange(out, count=1)
        if tail and json.loads(tail[0][1][EVENT_FIELD])["type"] in ("done", "error"):
            break
        time.sleep(0.01)
    elapsed = time.perf_counter() - start
    worker.stop.request()
    thread.join(timeout=60)
    return jobs / elapsed


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--jobs", type=int, default=1500)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--runs", type=int, default=2, help="runs per layout, interleaved")
    args = p.parse_args()
    server = local_redis.start()
    rates: dict[str, list[float]] = {"single": [], "sharded": []}
    try:
        for k in range(args.runs):
            for name, shards in (("single", None), ("sharded", args.shards)):
                rate = one_run(server.url, shards, args.jobs, args.max_tokens)
                rates[name].append(rate)
                print(f"run {k + 1} {name:7} {rate:7.1f} jobs/s", flush=True)
    finally:
        server.stop()
    single, sharded = (statistics.median(rates[n]) for n in ("single", "sharded"))
    print(json.dumps({"args": vars(args), "jobs_per_s": rates, "sharded_over_single": sharded / single}))


if __name__ == "__main__":
    main()
