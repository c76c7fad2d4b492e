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
Reported per run: events/s; Redis CPU seconds per million events and read events (about one per client
round trip) per thousand events, summed over the masters; and, labelled as a projection and not a
measurement, `projected_redis_bound_events_per_s` = events / the busiest master's CPU seconds: the rate at
which that server would fill one core, were the workers not the limit. `--commandstats` prints where the
servers' time went per command; `--replicas 0` runs the cluster without replicas (the single Redis never
has one).

Target (issue 13): cluster >= 2x one Redis with 3 masters. NOT shown. On a 2-core AMD EPYC VM shared with
other jobs (load average 5.5-5.9 during the runs), `--jobs 2048`, 8 shards, 1 replica per master:
one Redis 28.4k events/s, 5.98 Redis CPU s and 16.9 reads per million / thousand events; the cluster
18.2k events/s (0.64x), 17.92 CPU s and 87.2 reads; projected with Redis the limit 0.77x. The previous
worker (one MULTI round trip per shard, run from main's code in the same session): cluster 20.67 CPU s
and 103.2 reads, single 5.09 and 16.6. Sending a step's shard rounds with one write per master cut the
reads, but Redis CPU per event stays ~3x one Redis's, within this machine's noise of before: INFO
commandstats shows the time in the per-shard calls, not the round trips. Each shard's step is its own
EVALSHA of the event script (a script's keys must share a slot), ~8 us fixed per call (measured on one
Redis: 11.7 us for 1 job a call, 2.96 us per event at 64), so 8 shards pay it 8 times a step; XADD and
SPUBLISH cost more per call in cluster mode (2.5 and 1.1 us, against 1.4 and 0.14 for XADD and PUBLISH on
one Redis); and the masters feed their replicas (`--replicas 0`: 11.3 CPU s per million). Fewer shards per
master cost less (`--shards 3`: 11.9 against 6.95 in one noisy run). With the Python workers the limit on
2 cores, the throughput ratio says little; measure on a machine with a core per Redis server and per
worker process.
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


def reads_processed(ports: list[int]) -> int:
    """Read events the servers processed so far (INFO stats): about one per round trip a client makes."""
    return sum(
        int(connect(f"redis://127.0.0.1:{port}").info("stats")["total_reads_processed"]) for port in ports
    )


def cpu_seconds(ports: list[int]) -> list[float]:
    """Each server's CPU seconds so far (INFO cpu: user + sys)."""
    seconds = []
    for port in ports:
        info = connect(f"redis://127.0.0.1:{port}").info("cpu")
        seconds.append(float(info["used_cpu_user"]) + float(info["used_cpu_sys"]))
    return seconds


def print_commandstats(ports: list[int], setup: str) -> None:
    """Where the servers' time went, per command (INFO commandstats, summed over the servers)."""
    usec: dict[str, list[float]] = {}
    for port in ports:
        for name, stat in connect(f"redis://127.0.0.1:{port}").info("commandstats").items():
            calls_usec = usec.setdefault(name, [0, 0])
            calls_usec[0] += stat["calls"]
            calls_usec[1] += stat["usec"]
    top = sorted(usec.items(), key=lambda kv: -kv[1][1])[:10]
    print(setup, ", ".join(f"{k}: {int(c)} calls {u / 1e6:.3f} s" for k, (c, u) in top), file=sys.stderr)


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
    server = local_cluster.start(folder, replicas=args.replicas) if cluster else local_redis.start()
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
        cpu0, reads0, t0 = cpu_seconds(masters), reads_processed(masters), time.perf_counter()
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
        reads = reads_processed(masters) - reads0
        if args.commandstats:
            print_commandstats(masters, "cluster" if cluster else "single")
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
            "redis_reads_per_thousand_events": round(reads / events * 1e3, 1),
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
    parser.add_argument(
        "--replicas", type=int, default=1, help="per cluster master (the single Redis has none)"
    )
    parser.add_argument("--warmup-s", type=float, default=8.0)
    parser.add_argument("--commandstats", action="store_true", help="print each run's costliest commands")
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
