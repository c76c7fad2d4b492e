"""Soak test: two workers, thousands of jobs, random cancellations, a worker killed with -9 and
restarted every few seconds. Bounded in time; exits non-zero if any job is lost or any client stream has a
duplicated or missing token.

    python benchmarks/soak.py                      # ~60 s of load, then a bounded drain
    python benchmarks/soak.py --seconds 30 --rate 30
    python benchmarks/soak.py --shards 4           # protocol version 2's shards on one Redis (lanes worker)
    python benchmarks/soak.py --quick --out /tmp/soak.json   # 5 s of load, a kill every 2 s: checks it runs

It starts its own redis-server (loopback, free port, no persistence: Redis itself is not the thing killed
here) and its own tiny model unless --model/--redis-url are given. Counters:

    submitted      jobs enqueued (valid + deliberately invalid + duplicate enqueues of a running id)
    completed      done, not aborted by a cancel
    cancelled      done with finish_reason abort, reason cancel
    dead_lettered  ended with an error event (invalid on purpose, or too many attempts)
    lost           no terminal event after the drain                         -> must be 0
    tokens_duplicated / tokens_missing on the client streams                  -> must be 0
    text_mismatch  sampled finished jobs whose tokens differ from LLMEngine.generate -> must be 0
    jobs_resumed   takeovers that continued a stream (shows the kills hit jobs mid-generation)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

ROOT = str(Path(__file__).resolve().parents[1])
# First, even when PYTHONPATH names it too: sys.path[0] is benchmarks/, whose kernels.py would hide kernels/.
sys.path.insert(0, ROOT)

import redis  # noqa: E402

from worker.cluster.shard_keys import ShardedKeys  # noqa: E402
from worker.keys import EVENT_FIELD, JOB_FIELD, Keys  # noqa: E402
from worker.local_redis import free_port  # noqa: E402
from worker.shard_choice import choose_shard  # noqa: E402

K = Keys()
SHARDS: ShardedKeys | None = None  # --shards: the queue is that many shards of the one Redis


def keys_of(job_id: str) -> Keys:
    """The keys of a job's shard (shard_choice.py), or version 1's with no --shards."""
    return K if SHARDS is None else SHARDS.shard(choose_shard({"id": job_id}, SHARDS.shards))


def all_keys() -> list[Keys]:
    return [K] if SHARDS is None else SHARDS.all()


GROUP = "soak"
WORDS = "alpha beta gamma delta river stone cloud paper engine token stream worker lease claim".split()


# ---- processes ----------------------------------------------------------------------------------------------
def start_redis(folder: Path) -> tuple[subprocess.Popen, str]:
    binary = shutil.which("redis-server")
    if binary is None:
        sys.exit("soak: redis-server is not installed")
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen(
        args + ["--dir", str(folder)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return proc, url
        except redis.ConnectionError:
            if proc.poll() is not None or time.monotonic() > deadline:
                sys.exit("soak: redis-server did not start")
            time.sleep(0.02)


class WorkerSlot:
    """One of the two worker positions; `kill_and_restart` replaces its process (kill -9, then a new one)."""

    def __init__(self, name: str, args: argparse.Namespace, url: str, model: str, log_dir: Path) -> None:
        self.name, self.args, self.url, self.model, self.log_dir = name, args, url, model, log_dir
        self.proc: subprocess.Popen | None = None
        self.generation = 0
        self.consumer = name

    def spawn(self, consumer: str) -> None:
        self.generation += 1
        self.consumer = consumer
        cmd = [sys.executable, "-m", "worker.cli", "worker", "--model", self.model, "--redis-url", self.url]
        cmd += [
            "--consumer",
            consumer,
            "--group",
            GROUP,
            "--metrics-port",
            "0",
            "--lease-ms",
            str(self.args.lease_ms),
        ]
        cmd += [
            "--max-attempts",
            str(self.args.max_attempts),
            "--max-num-seqs",
            "32",
            "--num-kv-blocks",
            "2048",
        ]
        cmd += ["--max-num-batched-tokens", "1024", "--log-level", "info"]
        if SHARDS is not None:
            cmd += ["--shards", str(SHARDS.shards)]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        log = open(self.log_dir / f"{self.name}-{self.generation}.log", "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=log)

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(timeout=10)

    def crashed(self) -> bool:
        """Exited on its own (not by our kill): a worker bug."""
        return self.proc is not None and self.proc.poll() not in (None, -signal.SIGKILL)


# ---- load -------------------------------------------------------------------------------------------------
def make_job(rng: random.Random, k: int, bad_fraction: float) -> tuple[dict, bool]:
    job = {
        "id": f"s{k}",
        "prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randrange(2, 12))),
        "max_tokens": rng.randrange(4, 40),
    }
    if rng.random() < 0.15:  # long enough for kills and cancels to land mid-generation
        job.update(max_tokens=rng.randrange(100, 300), ignore_eos=True)
    if rng.random() < 0.5:
        job["temperature"] = 0.0
    else:
        job.update(temperature=0.8, seed=rng.randrange(1 << 30), top_k=50)
    if rng.random() < 0.3:
        job["ignore_eos"] = True
    if rng.random() < bad_fraction:
        job["top_p"] = 0.0  # refused by the engine's checks: must end dead-lettered with invalid_params
        return job, True
    return job, False


def run_load(
    r: redis.Redis, args, stop: threading.Event, jobs: dict, bad: set, cancelled: set, stats: Counter
):
    rng = random.Random(args.seed)
    k = 0
    cancels: list[tuple[float, str]] = []
    tick = 0.05
    while not stop.is_set():
        t0 = time.monotonic()
        pipe = r.pipeline(transaction=False)
        count = rng.randrange(0, max(1, int(2 * args.rate * tick)) + 1)
        for _ in range(count):
            job, is_bad = make_job(rng, k, args.bad_fraction)
            k += 1
            jobs[job["id"]] = job
            if is_bad:
                bad.add(job["id"])
            pipe.xadd(keys_of(job["id"]).requests, {JOB_FIELD: json.dumps(job)})
            stats["entries"] += 1
            if rng.random() < args.cancel_fraction:
                cancels.append((t0 + rng.uniform(0, 0.3), job["id"]))
        # Duplicate enqueue of a recent id (maybe running, maybe finished): never a second generation.
        if jobs and rng.random() < args.dup_fraction * max(1, count):
            job_id = f"s{rng.randrange(max(0, k - 50), k)}"
            pipe.xadd(keys_of(job_id).requests, {JOB_FIELD: json.dumps(jobs[job_id])})
            stats["duplicate_enqueues"] += 1
            stats["entries"] += 1
        now = time.monotonic()
        due = [c for c in cancels if c[0] <= now]
        cancels = [c for c in cancels if c[0] > now]
        for _, job_id in due:
            cancelled.add(job_id)
            if rng.random() < 0.5:
                pipe.publish(keys_of(job_id).cancel_channel, job_id)
            else:
                pipe.set(keys_of(job_id).cancel(job_id), 1, ex=600)
        try:
            pipe.execute()
        except redis.RedisError as exc:  # should not happen: Redis is not the thing being killed here
            print(f"soak: submit failed: {exc}", file=sys.stderr)
            stats["submit_errors"] += 1
        stop.wait(max(0.0, tick - (time.monotonic() - t0)))


def run_chaos(slots: list[WorkerSlot], args, stop: threading.Event, stats: Counter) -> None:
    rng = random.Random(args.seed + 1)
    turn = 0
    while not stop.wait(rng.uniform(0.6, 1.4) * args.kill_every):
        slot = slots[turn % len(slots)]
        turn += 1
        slot.kill9()
        stats["kills"] += 1
        # Half the time under the same consumer name (resumes its own pending list at once), else a new one
        # (its old pending entries wait for the lease to lapse and are claimed by XAUTOCLAIM).
        same = rng.random() < 0.5
        slot.spawn(slot.consumer if same else f"{slot.name}-g{slot.generation + 1}")
        stats["restarts"] += 1


# ---- checking ---------------------------------------------------------------------------------------------
def group_totals(r: redis.Redis) -> dict[str, int]:
    """The workers' group's lag and pending entries, summed over the request streams."""
    groups = [r.xinfo_groups(keys.requests)[0] for keys in all_keys()]
    return {name: sum(int(g[name] or 0) for g in groups) for name in ("lag", "pending")}


def wait_all_terminal(r: redis.Redis, ids: list[str], timeout_s: float) -> set[str]:
    left = set(ids)
    deadline = time.monotonic() + timeout_s
    while left and time.monotonic() < deadline:
        order = sorted(left)
        for start in range(0, len(order), 500):
            chunk = order[start : start + 500]
            pipe = r.pipeline(transaction=False)
            for job_id in chunk:
                pipe.xrevrange(keys_of(job_id).out(job_id), count=1)
            for job_id, last in zip(chunk, pipe.execute(), strict=True):
                if last and json.loads(last[0][1][EVENT_FIELD])["type"] in ("done", "error"):
                    left.discard(job_id)
        if left:
            time.sleep(0.25)
    return left


def check_streams(r: redis.Redis, jobs: dict, bad: set, cancelled_asked: set, counters: Counter):
    finished_ok: list[tuple[dict, list[int]]] = []
    ids = sorted(jobs)
    for start in range(0, len(ids), 500):
        chunk = ids[start : start + 500]
        pipe = r.pipeline(transaction=False)
        for job_id in chunk:
            pipe.xrange(keys_of(job_id).out(job_id))
        for job_id, entries in zip(chunk, pipe.execute(), strict=True):
            events = [json.loads(f[EVENT_FIELD]) for _, f in entries]
            ends = [e for e in events if e["type"] in ("done", "error")]
            seen: dict[int, int] = {}
            for e in events:
                if e["type"] != "token":
                    continue
                for j, t in enumerate(e["token_ids"]):
                    if e["index"] + j in seen:
                        counters["tokens_duplicated"] += 1
                    else:
                        seen[e["index"] + j] = t
            span = max(seen) + 1 if seen else 0
            if ends and ends[-1]["type"] == "done":
                span = max(span, ends[-1]["usage"]["completion_tokens"])
            counters["tokens_missing"] += sum(1 for p in range(span) if p not in seen)
            counters["tokens_published"] += len(seen)
            if not ends:
                counters["lost"] += 1
                print(f"soak: LOST {job_id}: {len(events)} events, no terminal", file=sys.stderr)
                continue
            if len(ends) > 1 or events[-1] is not ends[-1]:
                counters["terminal_duplicated"] += 1
            end = ends[0]
            if end["type"] == "error":
                counters["dead_lettered"] += 1
                counters[f"error:{end['code']}"] += 1
                if job_id not in bad and end["code"] != "too_many_attempts":
                    counters["unexpected_error"] += 1
                    print(f"soak: UNEXPECTED error for {job_id}: {end}", file=sys.stderr)
                continue
            if job_id in bad:
                counters["bad_job_ran"] += 1
            text = "".join(e["text"] for e in events if e["type"] == "token")
            if text != end["text"]:
                counters["text_mismatch"] += 1
            if end["finish_reason"] == "abort" and end.get("reason") == "cancel":
                counters["cancelled"] += 1
            else:
                counters["completed"] += 1
                if job_id not in cancelled_asked:
                    finished_ok.append((jobs[job_id], [seen[p] for p in sorted(seen)]))
    return finished_ok


def check_texts(
    model: str, finished: list[tuple[dict, list[int]]], sample: int, seed: int
) -> tuple[int, int]:
    """Compare a sample of finished jobs with an uninterrupted in-process run (tokens equal, in order)."""
    if not finished or sample <= 0:
        return 0, 0
    import torch

    from engine import LLMEngine, SamplingParams

    torch.set_num_threads(1)
    picked = random.Random(seed).sample(finished, min(sample, len(finished)))
    engine = LLMEngine(model, num_kv_blocks=2048, max_num_seqs=32)
    params = [
        SamplingParams(**{k: v for k, v in job.items() if k not in ("id", "prompt")}) for job, _ in picked
    ]
    results = engine.generate([job["prompt"] for job, _ in picked], params)
    mismatched = 0
    for (job, tokens), res in zip(picked, results, strict=True):
        if list(res.token_ids) != tokens:
            mismatched += 1
            print(
                f"soak: TEXT MISMATCH {job['id']}: got {tokens[:8]}.. want {list(res.token_ids)[:8]}..",
                file=sys.stderr,
            )
    return len(picked), mismatched


# ---- main -------------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=60, help="how long to submit load (then a bounded drain)")
    p.add_argument("--drain", type=float, default=45, help="seconds to wait for the last jobs to finish")
    p.add_argument("--rate", type=float, default=50, help="jobs per second submitted (on average)")
    p.add_argument("--kill-every", type=float, default=5, help="seconds between kill -9s (jittered)")
    p.add_argument("--cancel-fraction", type=float, default=0.05)
    p.add_argument("--bad-fraction", type=float, default=0.01)
    p.add_argument("--dup-fraction", type=float, default=0.01)
    p.add_argument("--lease-ms", type=int, default=1000)
    p.add_argument("--max-attempts", type=int, default=5)
    p.add_argument(
        "--check-texts", type=int, default=300, help="finished jobs compared with LLMEngine.generate"
    )
    p.add_argument("--model", default=None, help="checkpoint folder (default: a fresh tiny llama)")
    p.add_argument("--redis-url", default=None, help="use this server (flushed!) instead of starting one")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep", action="store_true", help="keep the temp folder with worker logs")
    p.add_argument("--shards", type=int, default=None, help="protocol version 2's shards on the one Redis")
    p.add_argument(
        "--quick", action="store_true", help="5 s at 10 jobs/s, a kill every 2 s, 10 texts checked"
    )
    p.add_argument("--out", type=Path, default=None, help="also write the summary here as JSON")
    args = p.parse_args(argv)
    if args.quick:
        args.seconds, args.rate, args.kill_every, args.check_texts = 5, 10, 2, 10
    global SHARDS
    SHARDS = None if args.shards is None else ShardedKeys(K.prefix, args.shards)

    work = Path(tempfile.mkdtemp(prefix="conveyor-soak-"))
    redis_proc = None
    slots: list[WorkerSlot] = []
    t_start = time.monotonic()
    try:
        model = args.model
        if model is None:
            from engine.tiny_model import make_tiny_model

            model = str(make_tiny_model(work / "tiny-llama", arch="llama"))
        if args.redis_url:
            url = args.redis_url
        else:
            redis_proc, url = start_redis(work)
        r = redis.Redis.from_url(url, socket_timeout=30)
        r.flushall()
        for keys in all_keys():
            r.xgroup_create(keys.requests, GROUP, id="0", mkstream=True)
        slots = [WorkerSlot(name, args, url, model, work) for name in ("a", "b")]
        for slot in slots:
            slot.spawn(slot.name)

        jobs: dict[str, dict] = {}
        bad: set[str] = set()
        cancelled_asked: set[str] = set()
        stats: Counter = Counter()
        stop_load, stop_chaos = threading.Event(), threading.Event()
        load = threading.Thread(target=run_load, args=(r, args, stop_load, jobs, bad, cancelled_asked, stats))
        chaos = threading.Thread(target=run_chaos, args=(slots, args, stop_chaos, stats))
        load.start()
        chaos.start()
        deadline = time.monotonic() + args.seconds
        while time.monotonic() < deadline:
            time.sleep(min(5.0, max(0.0, deadline - time.monotonic())))
            done = group_totals(r)
            print(
                f"soak: t={time.monotonic() - t_start:5.1f}s submitted={len(jobs)} kills={stats['kills']} "
                f"lag={done['lag']} pending={done['pending']}",
                flush=True,
            )
            crashed = [s.name for s in slots if s.crashed()]
            if crashed:
                print(f"soak: worker(s) {crashed} exited on their own (see logs in {work})", file=sys.stderr)
                stats["worker_crashes"] += len(crashed)
                for s in slots:
                    if s.crashed():
                        s.spawn(s.consumer)
        stop_load.set()
        load.join()
        stop_chaos.set()
        chaos.join()
        # Both workers up for the drain (the chaos thread may have just restarted one).
        print(f"soak: load stopped after {len(jobs)} jobs; draining (up to {args.drain:.0f}s)", flush=True)
        left = wait_all_terminal(r, sorted(jobs), args.drain)

        counters: Counter = Counter()
        finished = check_streams(r, jobs, bad, cancelled_asked, counters)
        group = group_totals(r)
        dead_entries = sum(r.xlen(keys.dead) for keys in all_keys())
        checked, mismatched = check_texts(model, finished, args.check_texts, args.seed)
        counters["text_mismatch"] += mismatched
        exit_codes = [s.stop() for s in slots]
        # Evidence that kills landed mid-generation: jobs a worker continued from tokens already published.
        resumed = sum(log.read_bytes().count(b'"job resumed"') for log in work.glob("*.log"))
        # 0: drained; -SIGTERM: stopped while still loading, before its signal handlers were installed.
        stats["worker_crashes"] += sum(1 for code in exit_codes if code not in (0, -signal.SIGTERM, None))
        summary = {
            "shards": args.shards or 0,
            "seconds": round(time.monotonic() - t_start, 1),
            "submitted": len(jobs),
            "entries_enqueued": stats["entries"],
            "duplicate_enqueues": stats["duplicate_enqueues"],
            "cancel_requests": len(cancelled_asked),
            "completed": counters["completed"],
            "cancelled": counters["cancelled"],
            "dead_lettered": counters["dead_lettered"],
            "dead_stream_entries": dead_entries,
            "errors": {k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("error:")},
            "lost": counters["lost"],
            "not_terminal_after_drain": len(left),
            "tokens_published": counters["tokens_published"],
            "tokens_duplicated": counters["tokens_duplicated"],
            "tokens_missing": counters["tokens_missing"],
            "terminal_duplicated": counters["terminal_duplicated"],
            "unexpected_errors": counters["unexpected_error"],
            "bad_jobs_run": counters["bad_job_ran"],
            "texts_checked": checked,
            "text_mismatch": counters["text_mismatch"],
            "pending_at_end": group["pending"],
            "lag_at_end": group["lag"],
            "jobs_resumed": resumed,
            "kills": stats["kills"],
            "restarts": stats["restarts"],
            "worker_crashes": stats["worker_crashes"],
            "worker_exit_codes": exit_codes,
        }
        width = max(map(len, summary))
        for key, value in summary.items():
            print(f"{key:<{width}}  {value}")
        print("SOAK_JSON " + json.dumps(summary))
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(summary, indent=1) + "\n")
        failures = [
            name
            for name in (
                "lost", "tokens_duplicated", "tokens_missing", "terminal_duplicated", "unexpected_errors",
                "bad_jobs_run", "text_mismatch", "pending_at_end", "worker_crashes",
            )
            if summary[name]
        ]  # fmt: skip
        if summary["completed"] == 0 or summary["kills"] == 0:
            failures.append("nothing exercised")
        if failures:
            args.keep = True
            print(f"soak: FAILED ({', '.join(failures)}); logs kept in {work}", file=sys.stderr)
            return 1
        print("soak: OK")
        return 0
    finally:
        for slot in slots:
            slot.kill9()
        if redis_proc is not None and redis_proc.poll() is None:
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
