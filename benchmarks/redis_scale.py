"""Token events per second that one Redis sustains under the workers' write pattern, against a 3-master
Redis Cluster (3 replicas), in one run; and Redis CPU seconds per million events (INFO cpu, masters).

    python benchmarks/redis_scale.py                          # 2 worker processes, 512 jobs x 64 tokens
    python benchmarks/redis_scale.py --workers 6 --jobs 2048  # more load (needs more cores than Redis)

Workers run the stub engine of the tests (tests/helpers/worker_fakes.FakeEngine with step_s=0: a token per
job per step, as fast as the worker can publish), `--max-num-seqs` jobs per step each, in separate
processes; the single-Redis run uses `Worker`, the cluster run `ShardedWorker` over `--shards` shards.
Jobs are queued while the workers wait, then timed from the first XADD to the last job acknowledged.
Redis must be the limit for the ratio to mean anything: with fewer free cores than worker processes
plus Redis servers, the Python workers are the limit and the ratio says so (close to 1).
Target (issue 13): cluster >= 2x one Redis with 3 masters. NOT met so far: on a 2-core AMD EPYC VM shared
with other jobs (defaults), one Redis 45.6k events/s and 4.6 Redis CPU s per million events, the cluster
17.5k events/s (0.38x) and 15.0 CPU s per million: the workers, not Redis, are the limit there, and in
cluster mode each step is one smaller MULTI per shard (8 round trips instead of 1), which costs Redis
more per event. Measure on a machine with a core per Redis server and per worker process.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import local_redis  # noqa: E402
from worker.cluster import local_cluster  # noqa: E402
from worker.cluster.client import ClusterClient  # noqa: E402
from worker.cluster.connect import connect_cluster  # noqa: E402
from worker.cluster.shard_keys import ShardedKeys  # noqa: E402
from worker.config import WorkerConfig  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.keys import JOB_FIELD, Keys  # noqa: E402


def serve(url: str, cluster: bool, shards: int, consumer: str, max_num_seqs: int, stop) -> None:
    """One worker process: the stub engine behind Worker or ShardedWorker, until `stop` is set."""
    import threading

    import structlog

    from tests.helpers.worker_fakes import FakeEngine

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    engine = FakeEngine(max_num_seqs=max_num_seqs, step_s=0)
    cfg = WorkerConfig(group="bench", consumer=consumer, cluster=cluster, shards=shards, block_ms=200)
    if cluster:
        from worker.cluster.sharded_worker import ShardedWorker

        worker = ShardedWorker(engine, connect_cluster(url), cfg)
    else:
        from worker.loop import Worker

        worker = Worker(engine, connect(url), cfg)
    threading.Thread(
        target=lambda: (stop.wait(), worker.stop.request(), worker.stop.request()), daemon=True
    ).start()
    worker.run()


def cpu_seconds(ports: list[int]) -> list[float]:
    """Each server's CPU seconds so far (INFO cpu: user + sys)."""
    seconds = []
    for port in ports:
        info = connect(f"redis://127.0.0.1:{port}").info("cpu")
        seconds.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return seconds


def groups_done(clients: list, streams: list[str]) -> bool:
    for client, stream in zip(clients, streams, strict=True):
        try:
            groups = client.xinfo_groups(stream)
        except Exception:  # the stream is not there yet
            return False
        if not groups or groups[0]["pending"] or groups[0]["lag"]:
            return False
    return True


def run(args, cluster: bool) -> dict:
    folder = Path(tempfile.mkdtemp())
    server = local_cluster.start(folder) if cluster else local_redis.start()
    url = server.url
    try:
        if cluster:
            rc = connect_cluster(url)
            client = ClusterClient(rc, ShardedKeys("conveyor", args.shards))
            masters = [n.port for n in rc.get_primaries()]
            streams = [client.sharded.shard(k).requests for k in range(args.shards)]
            clients = [client.node(k) for k in range(args.shards)]
        else:
            single = connect(url)
            masters, streams, clients = [server.port], [Keys().requests], [single]
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        procs = [
            ctx.Process(target=serve, args=(url, cluster, args.shards, f"b{i}", args.max_num_seqs, stop))
            for i in range(args.workers)
        ]
        for p in procs:
            p.start()
        time.sleep(args.warmup_s)  # imports and consumer groups
        cpu0, t0 = cpu_seconds(masters), time.perf_counter()
        jobs = [{"id": f"j{i}", "prompt": "x", "max_tokens": args.max_tokens} for i in range(args.jobs)]
        if cluster:
            for job in jobs:
                client.submit(job)
        else:
            pipe = single.pipeline(transaction=False)
            for job in jobs:
                pipe.xadd(Keys().requests, {JOB_FIELD: json.dumps(job)})
            pipe.execute()
        while not groups_done(clients, streams):
            time.sleep(0.05)
        elapsed = time.perf_counter() - t0
        per_master = [after - before for after, before in zip(cpu_seconds(masters), cpu0, strict=True)]
        cpu = sum(per_master)
        stop.set()
        for p in procs:
            p.join(timeout=60)
        events = args.jobs * (args.max_tokens + 1)  # tokens and one done event per job
        return {
            "setup": "cluster" if cluster else "single",
            "masters": len(masters),
            "events": events,
            "seconds": round(elapsed, 3),
            "events_per_s": round(events / elapsed),
            "redis_cpu_s_per_million_events": round(cpu / events * 1e6, 2),
            # A projection, not a measurement: the events/s at which the busiest server would use a whole
            # core, were the workers not the limit (each server on a core of its own).
            "projected_redis_bound_events_per_s": round(events / max(per_master)),
        }
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--jobs", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--warmup-s", type=float, default=8.0)
    args = parser.parse_args()
    single = run(args, cluster=False)
    clustered = run(args, cluster=True)
    for result in (single, clustered):
        print(json.dumps(result))
    print(f"cluster / single events per second: {clustered['events_per_s'] / single['events_per_s']:.2f}x")
    projected = clustered["projected_redis_bound_events_per_s"] / single["projected_redis_bound_events_per_s"]
    print(f"cluster / single, projected with Redis the limit: {projected:.2f}x")


if __name__ == "__main__":
    main()
