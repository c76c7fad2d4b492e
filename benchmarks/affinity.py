"""Prefix affinity across workers: the same jobs through 3 worker processes with and without
affinity, in one run.

    python benchmarks/affinity.py                    # the target's scale (see below)
    python benchmarks/affinity.py --quick            # 2 workers, 4 short prefixes x 2 jobs: checks it runs
    python benchmarks/affinity.py --json out.json    # {"with": {...}, "without": {...}, "runs": [...]}
    python benchmarks/affinity.py --repeats 3        # 3 runs of both modes (ABBA order): medians

Setup: a redis-server of its own, 3 `conveyor worker` processes (the tiny model, one torch thread each,
--shards S on one Redis, the workers' default batch limit of 64 sequences unless --max-num-seqs), each with
a KV pool of about `--pool-prefixes` prefixes. Prefix run: 36 distinct 512-token prefixes, each followed by
8 short suffixes, all 288 jobs queued at once in random order, 32 output tokens, greedy. Multi-turn run: 24
conversations (each opened by a document of its own) of 6 turns, turns interleaved (turn k of every
conversation, then turn k+1 with the replies). "without": jobs carry no key (spread by id over the shards)
and workers read every shard alike (their default policy); "with": jobs carry the default key
(worker/affinity_key.py) and workers run with --affinity (home shards by rendezvous hashing, then stealing).

Reported per mode: the CPU seconds of each worker, redis-server and this process over the prefix run
(`cpu_s`: the 2 cores are the budget, so a worker that spins costs the others), prompt tokens computed
(counted by the engines, summed from the registry records:
looked up minus found in the prefix cache) against received, output tok/s, jobs per worker (from the
workers' "job finished" log lines), p99 queue wait (the done events' queue_ms), and the multi-turn hit
rate. Prompt tokens computed is a count and holds on a loaded machine; the wall-clock figures do not.
Targets with affinity: computed <= 0.4x without, tok/s >= 1.5x, busiest/least busy worker <= 1.5,
p99 queue wait no worse than without. With --repeats, the modes run in ABBA order and each figure is
the median over the runs, each ratio the median of the runs' ratios (runs of 2-4 s on shared cores: one
run's tok/s ratio can be anywhere in 0.7x-2.0x).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker import local_redis  # noqa: E402
from worker.affinity_key import with_affinity  # noqa: E402
from worker.cli.tiny_model import resolve_model  # noqa: E402
from worker.client import enqueue  # noqa: E402
from worker.cluster.shard_keys import ShardedKeys  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.fleet import registry  # noqa: E402
from worker.fleet.home_shards import home_shards  # noqa: E402
from worker.job_queue import Cursor, JobQueue, read_outputs  # noqa: E402
from worker.keys import EVENT_FIELD, Keys  # noqa: E402
from worker.shard_choice import choose_shard  # noqa: E402

GROUP = "bench"
MODES = ("without", "with")
WORDS = (
    "harbour ledger cargo tide lantern keeper river stone cloud paper engine token stream worker lease claim "
    "north south copper salt timber grain wool spice amber cedar falcon meadow quarry signal anchor"
).split()


class Queue:
    """The sharded queue on one Redis (a worker.job_queue.JobQueue): submits with or without the key."""

    def __init__(self, client, shards: int, keyed: bool) -> None:
        self.client, self.sharded, self.keyed = client, ShardedKeys("conveyor", shards), keyed

    @property
    def shards(self) -> int:
        return self.sharded.shards

    def submit(self, job: dict) -> int:
        job = with_affinity(job) if self.keyed else job
        shard = choose_shard(job, self.shards)
        enqueue(self.client, job, self.sharded.shard(shard), affinity=False)
        return shard

    def keys(self, shard: int) -> Keys:
        return self.sharded.shard(shard)

    def node(self, shard: int):
        return self.client


def text_of(tokenizer, seed: int, tokens: int, head: str) -> str:
    """`head` then random words, cut to `tokens` tokens of the model's tokenizer."""
    rng = random.Random(seed)
    words = " ".join(rng.choice(WORDS) for _ in range(tokens * 2))
    ids = tokenizer.encode(head + words, add_special_tokens=False)[:tokens]
    return tokenizer.decode(ids)


def start_workers(args, url: str, model: str, keyed: bool, logs: Path) -> list[tuple[subprocess.Popen, Path]]:
    procs = []
    for i in range(args.workers):
        log = logs / f"{'with' if keyed else 'without'}-w{i}.log"
        cmd = [sys.executable, "-m", "worker.cli", "worker", "--model", model, "--redis-url", url]
        cmd += ["--consumer", f"w{i}", "--group", GROUP, "--metrics-port", "0", "--torch-threads", "1"]
        cmd += ["--shards", str(args.shards), "--num-kv-blocks", str(args.kv_blocks), "--block-size", "16"]
        cmd += ["--registry-interval", str(args.registry_interval), "--dtype", "float32"]
        if args.max_num_seqs is not None:  # else the worker's own default (64)
            cmd += ["--max-num-seqs", str(args.max_num_seqs)]
        cmd += ["--log-level", "info", *(["--affinity"] if keyed else [])]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
        procs.append(
            (subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb")), log)
        )
    return procs


def wait_registered(client, count: int, shards: int | None, timeout_s: float = 300) -> None:
    """Until `count` workers are live and, with affinity (`shards`), each record shows the home shards
    rendezvous hashing gives it among all of them: no job is read under a start-up ownership that moves
    (a worker idle on 12 lanes blocks ~100 ms on each, so it may see a peer a second late)."""
    deadline = time.monotonic() + timeout_s
    while not settled(registry.live(registry.read(client, Keys())), count, shards):
        if time.monotonic() > deadline:
            sys.exit("affinity bench: the workers did not register, or their home shards did not settle")
        time.sleep(0.2)
    time.sleep(1.5)  # the last refresh's heartbeat, and a margin


def settled(records, count: int, shards: int | None) -> bool:
    if len(records) < count:
        return False
    if shards is None:
        return True
    owned = home_shards(shards, [r.consumer for r in records])
    return all(sorted(owned[r.consumer]) == r.home_shards for r in records)


def counters(client) -> dict[str, int]:
    records = registry.live(registry.read(client, Keys()))
    return {
        "received": sum(r.prompt_tokens for r in records),
        "queries": sum(r.prefix_cache_queries for r in records),
        "hits": sum(r.prefix_cache_hits for r in records),
    }


def settled_counters(client) -> dict[str, int]:
    """The records once the engines are idle and a heartbeat wrote their last numbers."""
    time.sleep(1.2)
    return counters(client)


def run_jobs(queue: JobQueue, jobs: list[dict]) -> tuple[dict[str, dict], float]:
    """Submit all, read every terminal event; returns the done events by id and the wall time."""
    start = time.perf_counter()
    cursors: dict[str, Cursor] = {}
    names: dict[str, str] = {}  # output stream -> job id
    for job in jobs:
        shard = queue.submit(job)
        name = queue.keys(shard).out(job["id"])
        cursors[name], names[name] = Cursor(shard), job["id"]
    done: dict[str, dict] = {}
    while cursors:
        for name, entries in read_outputs(queue, cursors, 1000):
            for entry_id, fields in entries:
                cursors[name].last_id = entry_id
                event = json.loads(fields[EVENT_FIELD])
                if event["type"] in ("done", "error"):
                    done[names[name]] = event
                    del cursors[name]
                    break
    return done, time.perf_counter() - start


def finished_per_worker(logs: list[Path], ids: set[str]) -> list[int]:
    counts = []
    for log in logs:
        n = 0
        for line in log.read_bytes().splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            n += entry.get("event") == "job finished" and entry.get("request_id") in ids
        counts.append(n)
    return counts


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def one_mode(args, server, model: str, tokenizer, keyed: bool, logs: Path) -> dict:
    url = server.url
    client = connect(url)
    client.flushall()
    mode = "with" if keyed else "without"
    procs = start_workers(args, url, model, keyed, logs)
    try:
        wait_registered(client, args.workers, args.shards if keyed else None)
        queue = Queue(client, args.shards, keyed)
        rng = random.Random(7)
        prefixes = [
            text_of(tokenizer, p, args.prefix_tokens, f"Document {p} of the harbour archive. ")
            for p in range(args.prefixes)
        ]
        jobs = [
            {
                "id": f"{mode}-p{p}-j{j}",
                "prompt": prefixes[p] + f"\nQuestion {j}: what does line {j * 7 + p} say?",
                "max_tokens": args.max_tokens,
                "temperature": 0.0,
                "ignore_eos": True,
            }
            for p in range(args.prefixes)
            for j in range(args.jobs_per_prefix)
        ]
        rng.shuffle(jobs)
        before = counters(client)
        pids = {
            "workers": [proc.pid for proc, _ in procs],
            "redis": [server.process.pid],
            "bench": [os.getpid()],
        }
        cpu_before = {name: [cpu_seconds(pid) for pid in group] for name, group in pids.items()}
        done, wall = run_jobs(queue, jobs)
        cpu_used = {
            name: [cpu_seconds(pid) - start for pid, start in zip(group, cpu_before[name], strict=True)]
            for name, group in pids.items()
        }
        after = settled_counters(client)
        failed = [i for i, e in done.items() if e["type"] != "done"]
        out_tokens = sum(e["usage"]["completion_tokens"] for e in done.values() if e["type"] == "done")
        result = {
            "prompt_tokens_received": after["received"] - before["received"],
            "prompt_tokens_computed": (after["queries"] - after["hits"])
            - (before["queries"] - before["hits"]),
            "tok_s": out_tokens / wall,
            "wall_s": wall,
            "jobs_per_worker": finished_per_worker([log for _, log in procs], {j["id"] for j in jobs}),
            "p99_queue_ms": p99([e["timing"]["queue_ms"] for e in done.values() if e["type"] == "done"]),
            "failed": len(failed),
            # CPU seconds per process during the prefix run: the 2 cores' share of the wall time.
            "cpu_s": cpu_used,
        }
        result["multi_turn_hit_rate"] = multi_turn(args, queue, client, tokenizer, mode, rng)
        return result
    finally:
        for proc, _ in procs:
            proc.send_signal(signal.SIGTERM)
        for proc, _ in procs:
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def multi_turn(args, queue: Queue, client, tokenizer, mode: str, rng: random.Random) -> float:
    conversations = [
        [
            {
                "role": "system",
                "content": text_of(
                    tokenizer, 1000 + c, args.doc_tokens, f"Conversation {c}: the ledger of ship {c}. "
                ),
            }
        ]
        for c in range(args.conversations)
    ]
    before = counters(client)
    for turn in range(args.turns):
        jobs = []
        for c, messages in enumerate(conversations):
            messages.append({"role": "user", "content": f"Turn {turn}: and then what happened to ship {c}?"})
            jobs.append(
                {
                    "id": f"{mode}-c{c}-t{turn}",
                    "messages": list(messages),
                    "max_tokens": args.max_tokens,
                    "temperature": 0.0,
                    "ignore_eos": True,
                }
            )
        rng.shuffle(jobs)
        done, _ = run_jobs(queue, jobs)
        for c, messages in enumerate(conversations):
            event = done[f"{mode}-c{c}-t{turn}"]
            messages.append({"role": "assistant", "content": event.get("text", "")})
    after = settled_counters(client)
    queries = after["queries"] - before["queries"]
    return (after["hits"] - before["hits"]) / queries if queries else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="2 workers, 4 shards, 4 prefixes of 64 tokens x 2 jobs, pool of 2, 2 x 2 turns, 4 tokens each",
    )  # fmt: skip
    parser.add_argument("--json", default=None, help="write {'with': {...}, 'without': {...}} here")
    parser.add_argument("--repeats", type=int, default=1, help="runs of both modes, reported as medians")
    parser.add_argument("--logs", default=None, help="keep the workers' logs in this folder")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--shards", type=int, default=12)
    parser.add_argument("--prefixes", type=int, default=36)
    parser.add_argument("--jobs-per-prefix", type=int, default=8)
    parser.add_argument("--prefix-tokens", type=int, default=512)
    parser.add_argument("--pool-prefixes", type=int, default=15, help="a worker's KV pool, in prefixes")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--max-num-seqs", type=int, default=None, help="the workers' batch limit (default: theirs, 64)"
    )
    parser.add_argument("--registry-interval", type=float, default=0.5, help="the workers' heartbeat, s")
    parser.add_argument("--conversations", type=int, default=24)
    parser.add_argument("--turns", type=int, default=6)
    parser.add_argument("--doc-tokens", type=int, default=256)
    args = parser.parse_args()
    if args.quick:
        args.workers, args.shards, args.prefixes, args.jobs_per_prefix = 2, 4, 4, 2
        args.prefix_tokens, args.pool_prefixes, args.max_tokens = 64, 2, 4
        args.conversations, args.turns, args.doc_tokens = 2, 2, 32
    blocks_per_prefix = -(-args.prefix_tokens // 16)
    args.kv_blocks = args.pool_prefixes * blocks_per_prefix
    model = resolve_model(args.model)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    server = local_redis.start()
    runs: list[dict] = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.repeats):
                logs = Path(args.logs or tmp) / (f"run{r}" if args.repeats > 1 else "")
                logs.mkdir(parents=True, exist_ok=True)
                run = {}
                for keyed in (False, True) if r % 2 == 0 else (True, False):  # ABBA: drift cancels
                    run["with" if keyed else "without"] = one_mode(
                        args, server, model, tokenizer, keyed, logs
                    )
                runs.append(run)
    finally:
        server.stop()
    report(args, runs)


FIGURES = ("prompt_tokens_received", "prompt_tokens_computed", "tok_s", "p99_queue_ms", "multi_turn_hit_rate")


def spread(jobs_per_worker: list[int]) -> float:
    return max(jobs_per_worker) / max(1, min(jobs_per_worker))


def report(args, runs: list[dict]) -> None:
    """Per figure the median over the runs of each mode, and the median of the per-run ratios (a run
    pairs the two modes, minutes apart at most: on a shared machine the load drifts between runs)."""
    ratios = {
        name: [
            run["with"][name] / run["without"][name] if run["without"][name] else float("nan") for run in runs
        ]
        for name in FIGURES
    }
    ratios["busiest_least"] = [spread(run["with"]["jobs_per_worker"]) for run in runs]
    median = {
        mode: {name: statistics.median(run[mode][name] for run in runs) for name in FIGURES} for mode in MODES
    }
    for mode in MODES:
        median[mode]["jobs_per_worker"] = [run[mode]["jobs_per_worker"] for run in runs]
    print(f"{'':28}{'without':>12}{'with':>12}{'ratio':>8}   ({len(runs)} run(s): medians)")
    for name in FIGURES:
        wo, w = median["without"][name], median["with"][name]
        print(f"{name:28}{wo:12.3f}{w:12.3f}{statistics.median(ratios[name]):8.2f}")
    print(f"{'busiest/least (with)':52}{statistics.median(ratios['busiest_least']):8.2f}")
    for mode in MODES:  # CPU seconds over the prefix run, median per process kind
        cpu = {
            kind: statistics.median(sum(run[mode]["cpu_s"][kind]) for run in runs)
            for kind in runs[0][mode]["cpu_s"]
        }
        print(f"  cpu s, {mode}: " + ", ".join(f"{kind} {sec:.2f}" for kind, sec in cpu.items()))
    if len(runs) > 1:
        for name in ("prompt_tokens_computed", "tok_s", "p99_queue_ms", "busiest_least"):
            print(f"  per run, {name}: {', '.join(f'{x:.2f}' for x in ratios[name])}")
    print(
        "targets with affinity: computed <= 0.4x, tok/s >= 1.5x, busiest/least <= 1.5, p99 queue <= without"
    )
    print("(wall-clock figures are noise on a loaded machine; prompt tokens computed is a count)")
    setup = {k: v for k, v in vars(args).items() if k not in ("json", "logs")}
    if args.json:
        out = {**median, "ratios": ratios, "runs": runs, "setup": setup}
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
