"""Token events per second that one Redis sustains under the workers' write pattern, against a 3-master
Redis Cluster, in one run, like for like: each pairing gives both sides the same replicas per master
(`--replicas 0 1`: no replicas on either side, then one replica on each). Per run, where each master's
CPU went (INFO cpu, INFO commandstats, INFO stats, before and after, masters and replicas).

    python benchmarks/redis_scale.py                              # 2 workers, 1024 jobs x 64 tokens
    python benchmarks/redis_scale.py --workers 6 --jobs 4096      # more load (needs more cores)
    python benchmarks/redis_scale.py --step-ms 20 --cluster-workers 3 --workers 1   # equal load per master
    python benchmarks/redis_scale.py --quick --out /tmp/r.json    # 1 worker, 32 short jobs, no replicas

Workers run the stub engine of the tests (tests/helpers/worker_fakes.FakeEngine: a token per job per
step, with `--step-ms 0` as fast as the worker can publish), `--max-num-seqs` jobs per step each, jobs
of mixed lengths (--max-tokens on average; `--fixed-length` for all equal), in
separate processes; the single-Redis run uses `Worker`, the cluster run a lane per shard over `--shards`
shards. The shards' slots are first moved so that every master holds as many shards as the others (+-1;
local_cluster.spread_shards): with N shards only N slots carry the load, and the cluster's even slot
ranges put 8 shards 2/2/4 and 6 shards 1/1/4 (`--no-spread` keeps that; the busiest master's share of
the events is reported either way). Jobs are queued (pipelined, no WAIT) once every worker has joined
every stream's consumer group, and timed from then to the last job acknowledged.

Reported per run (`per_million_events` sums over the masters unless named per master):
- `master_cpu_s`, `replica_cpu_s`: used_cpu_user + used_cpu_sys;
- `in_rounds_s`: EXEC's usec (a step's MULTI/EXEC with everything in it: the event script, reads, cancel
  checks, leases); `scripts_s`: EVALSHA's usec (the event script, its XADDs and PUBLISHes included);
  `event_commands_s`: XADD + PUBLISH/SPUBLISH usec (the commands the script runs per event);
- `outside_commands_s` = master CPU - in_rounds: the event loop, reading and parsing requests, writing
  replies, feeding replicas (replication stream; SPUBLISH also goes over the cluster bus), cluster bus,
  cron, and the few commands sent outside a round (blocking reads while idle, this script's INFO);
- `per_thousand_events`: rounds (EXEC calls), script calls, XREADGROUP calls, read events (about one per
  client round trip);
- `us_per_call`: microseconds per call of EXEC, EVALSHA, XADD, PUBLISH/SPUBLISH, XREADGROUP;
- `masters_detail`: per master its events (one PUBLISH/SPUBLISH each), CPU and its replicas' CPU per million of
  them;
- `projected_redis_bound_events_per_s` = events / the busiest master's CPU seconds: A PROJECTION, NOT A
  MEASUREMENT: the rate at which that server would fill one core, were nothing else the limit.

On 2 cores the Python workers, not Redis, are the limit (each Redis server and each worker needs a core
of its own for a sustained-throughput ratio), so the measured events/s ratio says little; the projection
and the CPU per event say where Redis's time goes.

Target: cluster >= 2x one Redis's events/s with 3 masters, which needs a core per Redis server and per
worker process to show. The current figures are in benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import local_redis  # noqa: E402
from worker.cluster import local_cluster  # noqa: E402
from worker.cluster.connect import connect_cluster  # noqa: E402
from worker.cluster.shard_keys import ShardedKeys  # noqa: E402
from worker.config import WorkerConfig  # noqa: E402
from worker.keys import JOB_FIELD, Keys  # noqa: E402
from worker.shard_choice import choose_shard  # noqa: E402

GROUP = "bench"
RESULTS = Path(__file__).resolve().parent / "results"


def serve(
    url: str, cluster: bool, shards: int, consumer: str, max_num_seqs: int, step_s: float, stop
) -> None:
    """One worker process: the stub engine behind the Worker, until `stop` is set."""
    import threading

    import structlog

    from tests.helpers.worker_fakes import FakeEngine
    from worker.connection import connect

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
    engine = FakeEngine(max_num_seqs=max_num_seqs, step_s=step_s)
    cfg = WorkerConfig(group=GROUP, consumer=consumer, cluster=cluster, shards=shards, block_ms=200)
    if cluster:
        from worker.run.build import build

        worker = build(engine, connect_cluster(url), cfg)
    else:
        from worker.run.loop import Worker

        worker = Worker(engine, connect(url), cfg)
    threading.Thread(
        target=lambda: (stop.wait(), worker.stop.request(), worker.stop.request()), daemon=True
    ).start()
    worker.run()


# ---- the servers ----------------------------------------------------------------------------------------
@dataclass
class Servers:
    """The masters (with the request streams each holds) and, per master, its replicas' ports."""

    url: str
    masters: list[int]
    replicas: dict[int, list[int]]
    streams: dict[int, list[str]]  # master port -> request streams on it
    stop: object  # () -> None: stops every server by its PID


def node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, socket_timeout=10)


def replica_ports(port: int) -> list[int]:
    info = node(port).info("replication")
    return [int(v["port"]) for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]


def start_single(replicas: int, folder: Path) -> Servers:
    """One Redis, and `replicas` servers started with --replicaof it, synced before this returns."""
    master = local_redis.start(extra_args=["--repl-diskless-sync-delay", "0", "--dir", str(folder)])
    started = [master]
    try:
        for _ in range(replicas):
            args = ["--replicaof", "127.0.0.1", str(master.port), "--dir", str(folder)]
            started.append(local_redis.start(extra_args=args))
        deadline = time.monotonic() + 30
        while True:
            info = node(master.port).info("replication")
            online = [v for k, v in info.items() if k.startswith("slave") and isinstance(v, dict)]
            if sum(v.get("state") == "online" for v in online) >= replicas:
                break
            if time.monotonic() > deadline:
                raise RuntimeError("the replica did not sync")
            time.sleep(0.05)
    except BaseException:
        for server in started:
            server.stop()
        raise
    return Servers(
        master.url,
        [master.port],
        {master.port: replica_ports(master.port)},
        {master.port: [Keys().requests]},
        lambda: [server.stop() for server in started],
    )


def start_cluster(masters: int, replicas: int, shards: int, spread: bool, folder: Path) -> Servers:
    cluster = local_cluster.start(folder, masters=masters, replicas=replicas)
    try:
        streams = [k.requests for k in ShardedKeys("conveyor", shards).all()]
        if spread:
            cluster.spread_shards(streams)
        with connect_cluster(cluster.url) as rc:
            masters = [n.port for n in rc.get_primaries()]
            by_master: dict[int, list[str]] = {port: [] for port in masters}
            for stream in streams:
                by_master[rc.get_node_from_key(stream).port].append(stream)
    except BaseException:
        cluster.stop()
        raise
    return Servers(
        cluster.url, masters, {port: replica_ports(port) for port in masters}, by_master, cluster.stop
    )


# ---- what the servers did -----------------------------------------------------------------------------
@dataclass
class Snapshot:
    cpu: float  # used_cpu_user + used_cpu_sys, seconds
    reads: int  # total_reads_processed
    calls: dict[str, int]  # command -> calls
    usec: dict[str, int]  # command -> microseconds

    def __sub__(self, before: Snapshot) -> Snapshot:
        return Snapshot(
            self.cpu - before.cpu,
            self.reads - before.reads,
            {k: v - before.calls.get(k, 0) for k, v in self.calls.items()},
            {k: v - before.usec.get(k, 0) for k, v in self.usec.items()},
        )


def snapshot(port: int) -> Snapshot:
    client = node(port)
    cpu = client.info("cpu")
    stats = {name.removeprefix("cmdstat_"): s for name, s in client.info("commandstats").items()}
    return Snapshot(
        float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]),
        int(client.info("stats")["total_reads_processed"]),
        {k: int(s["calls"]) for k, s in stats.items()},
        {k: int(s["usec"]) for k, s in stats.items()},
    )


def usec(s: Snapshot, *names: str) -> float:
    return sum(s.usec.get(n, 0) for n in names) / 1e6


def calls(s: Snapshot, *names: str) -> int:
    return sum(s.calls.get(n, 0) for n in names)


def lengths(args) -> list[int]:
    """Each job's max_tokens: all --max-tokens with --fixed-length (the jobs of a step then all end
    together and the engine's room opens a whole batch at a time), else spread evenly over
    [max_tokens / 2, 3 * max_tokens / 2) in a scrambled order, so that the room opens a few jobs at a time
    and a worker's batch mixes jobs read at different times, as under real traffic."""
    if args.fixed_length:
        return [args.max_tokens] * args.jobs
    half = max(1, args.max_tokens // 2)
    return [half + (i * 7919) % (2 * half) for i in range(args.jobs)]


# ---- one run ------------------------------------------------------------------------------------------
def ready(servers: Servers, workers: int) -> bool:
    """Every worker has joined the consumer group of every stream (so none is still starting up)."""
    for port, streams in servers.streams.items():
        for stream in streams:
            try:
                groups = node(port).xinfo_groups(stream)
            except redis.ResponseError:  # not created yet
                return False
            if not groups or groups[0]["consumers"] < workers:
                return False
    return True


def done(servers: Servers) -> bool:
    for port, streams in servers.streams.items():
        for stream in streams:
            group = node(port).xinfo_groups(stream)[0]
            if group["pending"] or group["lag"]:
                return False
    return True


def submit(servers: Servers, cluster: bool, shards: int, jobs: list[dict]) -> None:
    """Pipelined XADDs to each job's stream (the shard ClusterClient.submit would pick), no WAIT."""
    if not cluster:
        [(port, [stream])] = servers.streams.items()
        by_stream = {stream: jobs}
    else:
        sharded = ShardedKeys("conveyor", shards)
        by_stream = {}
        for job in jobs:
            by_stream.setdefault(sharded.shard(choose_shard(job, shards)).requests, []).append(job)
    for port, streams in servers.streams.items():
        pipe = node(port).pipeline(transaction=False)
        for stream in streams:
            for job in by_stream.get(stream, []):
                pipe.xadd(stream, {JOB_FIELD: json.dumps(job)})
        pipe.execute()


def run(args, cluster: bool, replicas: int) -> dict:
    folder = Path(tempfile.mkdtemp())
    servers = (
        start_cluster(args.masters, replicas, args.shards, args.spread, folder)
        if cluster
        else start_single(replicas, folder)
    )
    workers = args.cluster_workers if cluster else args.workers
    try:
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        procs = [
            ctx.Process(
                target=serve,
                args=(
                    servers.url,
                    cluster,
                    args.shards,
                    f"b{i}",
                    args.max_num_seqs,
                    args.step_ms / 1000,
                    stop,
                ),
            )
            for i in range(workers)
        ]
        for p in procs:
            p.start()
        deadline = time.monotonic() + 120
        while not ready(servers, workers):
            if time.monotonic() > deadline:
                raise RuntimeError("workers did not start")
            time.sleep(0.1)
        ports = [*servers.masters, *(p for m in servers.masters for p in servers.replicas[m])]
        before = {port: snapshot(port) for port in ports}
        t0 = time.perf_counter()
        jobs = [
            {"id": f"j{i}", "prompt": "x", "max_tokens": tokens} for i, tokens in enumerate(lengths(args))
        ]
        submit(servers, cluster, args.shards, jobs)
        while not done(servers):
            time.sleep(0.02)
        elapsed = time.perf_counter() - t0
        delta = {port: snapshot(port) - before[port] for port in ports}
        stop.set()
        for p in procs:
            p.join(timeout=60)
        return report(args, cluster, replicas, workers, servers, delta, elapsed)
    finally:
        servers.stop()  # type: ignore[operator]


def report(args, cluster, replicas, workers, servers: Servers, delta: dict[int, Snapshot], elapsed) -> dict:
    events = sum(tokens + 1 for tokens in lengths(args))  # tokens and one done event per job
    masters = [delta[m] for m in servers.masters]
    master_cpu = sum(s.cpu for s in masters)
    replica_cpu = sum(delta[r].cpu for m in servers.masters for r in servers.replicas[m])
    in_rounds = sum(usec(s, "exec") for s in masters)
    per_million = 1e6 / events
    per_master = []
    for port, s in zip(servers.masters, masters, strict=True):
        served = calls(s, "publish", "spublish")  # one per event
        per_master.append(
            {
                "shards": len(servers.streams[port]),
                "events": served,
                "cpu_s_per_million_events": round(s.cpu / max(served, 1) * 1e6, 2),
                "replica_cpu_s_per_million_events": round(
                    sum(delta[r].cpu for r in servers.replicas[port]) / max(served, 1) * 1e6, 2
                ),
                "events_per_script_call": round(served / max(calls(s, "evalsha"), 1), 1),
            }
        )
    return {
        "setup": "cluster" if cluster else "single",
        "replicas_per_master": replicas,
        "masters": len(masters),
        "shards": args.shards if cluster else 1,
        "workers": workers,
        "events": events,
        "seconds": round(elapsed, 3),
        "events_per_s": round(events / elapsed),
        "busiest_master_share": round(max(m["events"] for m in per_master) / events, 3),
        "per_million_events": {
            "master_cpu_s": round(master_cpu * per_million, 2),
            "replica_cpu_s": round(replica_cpu * per_million, 2),
            "in_rounds_s": round(in_rounds * per_million, 2),
            "scripts_s": round(sum(usec(s, "evalsha") for s in masters) * per_million, 2),
            "event_commands_s": round(
                sum(usec(s, "xadd", "publish", "spublish") for s in masters) * per_million, 2
            ),
            "outside_commands_s": round((master_cpu - in_rounds) * per_million, 2),
        },
        "per_thousand_events": {
            name: round(sum(calls(s, command) for s in masters) / events * 1e3, 1)
            for name, command in (
                ("rounds", "exec"),
                ("script_calls", "evalsha"),
                ("xreadgroup", "xreadgroup"),
            )
        }
        | {"reads": round(sum(s.reads for s in masters) / events * 1e3, 1)},
        # Microseconds per call, over the masters (commandstats): what one command costs in each mode.
        "us_per_call": {
            name: round(
                sum(usec(s, *commands) for s in masters)
                * 1e6
                / max(1, sum(calls(s, *commands) for s in masters)),
                2,
            )
            for name, commands in (
                ("exec", ("exec",)),
                ("evalsha", ("evalsha",)),
                ("xadd", ("xadd",)),
                ("publish_or_spublish", ("publish", "spublish")),
                ("xreadgroup", ("xreadgroup",)),
            )
        },
        "masters_detail": per_master,
        # A projection, not a measurement (see the docstring).
        "projected_redis_bound_events_per_s": round(events / max(s.cpu for s in masters)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--workers", type=int, default=2, help="worker processes on the single Redis")
    parser.add_argument(
        "--cluster-workers", type=int, default=None, help="on the cluster (default: --workers)"
    )
    parser.add_argument("--jobs", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--fixed-length", action="store_true", help="every job --max-tokens long")
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--step-ms", type=float, default=0.0, help="the stub engine's step time (0: none)")
    parser.add_argument("--shards", type=int, default=6)
    parser.add_argument(
        "--masters", type=int, default=3, help="the cluster's (1: cluster mode alone, against one Redis)"
    )
    parser.add_argument("--no-spread", dest="spread", action="store_false", help="keep the slots as created")
    parser.add_argument(
        "--replicas", type=int, nargs="+", default=[0, 1], help="per master, one pairing each"
    )
    parser.add_argument("--label", default="", help="writes benchmarks/results/redis_scale-<label>.json")
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (default: see --label)")
    parser.add_argument(
        "--quick", action="store_true", help="1 worker a side, 32 jobs of 8 tokens, 3 shards, no replicas"
    )
    args = parser.parse_args()
    if args.quick:
        args.workers, args.jobs, args.max_tokens, args.shards, args.replicas = 1, 32, 8, 3, [0]
    args.cluster_workers = args.cluster_workers or args.workers
    pairings = []
    for replicas in args.replicas:
        single = run(args, cluster=False, replicas=replicas)
        clustered = run(args, cluster=True, replicas=replicas)
        pairing = {
            "replicas_per_master": replicas,
            "single": single,
            "cluster": clustered,
            "cluster_over_single_events_per_s": round(clustered["events_per_s"] / single["events_per_s"], 2),
            "cluster_over_single_projected": round(
                clustered["projected_redis_bound_events_per_s"]
                / single["projected_redis_bound_events_per_s"],
                2,
            ),
        }
        pairings.append(pairing)
        for result in (single, clustered):
            print(json.dumps(result))
        print(
            f"replicas {replicas}: cluster / single events/s {pairing['cluster_over_single_events_per_s']}x "
            f"(measured, workers the limit on this machine); projected with Redis the limit "
            f"{pairing['cluster_over_single_projected']}x (a projection)",
            flush=True,
        )
    out = args.out or RESULTS / (f"redis_scale-{args.label}.json" if args.label else "redis_scale.json")
    record = {
        "command": "python benchmarks/redis_scale.py " + " ".join(sys.argv[1:]),
        "projection_note": "projected_redis_bound_events_per_s = events / CPU seconds of the busiest master: "
        "a projection of the rate at which it would fill one core, not a measurement",
        "pairings": pairings,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
