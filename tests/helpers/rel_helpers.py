"""Helpers for the reliability tests: our own redis-server processes, `conveyor worker` processes, stream checks.

Everything targets 127.0.0.1, every process is stopped by its PID, and every wait is bounded.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from tests.helpers.waiting import wait_until
from worker.keys import EVENT_FIELD, JOB_FIELD, Keys
from worker.local_redis import free_port

ROOT = str(Path(__file__).resolve().parents[2])
GROUP = "rel"
K = Keys()


# ---- redis-server ---------------------------------------------------------------------------------------
@dataclass
class RedisProc:
    """A redis-server we started. `restart()` brings it back on the same port and data directory."""

    dir: Path
    args: list[str]
    port: int
    tls_port: int | None = None
    password: str | None = None
    process: subprocess.Popen | None = None
    starts: int = 0

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def client(self, **kw) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, **kw)

    def start(self) -> RedisProc:
        self.starts += 1
        log = open(self.dir / f"redis-{self.starts}.log", "wb")
        self.process = subprocess.Popen(self.args, cwd=self.dir, stdout=log, stderr=subprocess.STDOUT)
        client = self.client(socket_connect_timeout=0.5)

        def up() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"redis-server exited: {(self.dir / f'redis-{self.starts}.log').read_text()}"
                )
            try:
                return bool(client.ping())
            except redis.BusyLoadingError:
                return False
            except redis.ConnectionError:
                return False

        try:
            wait_until(up, 15, "redis-server to answer", 0.02)
        finally:
            client.close()
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """By PID only."""
        proc = self.process
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(sig)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self) -> RedisProc:
        self.stop()
        return self.start()


def redis_binary() -> str | None:
    return shutil.which("redis-server")


def make_redis(
    dir: Path,
    *,
    aof: bool = False,
    password: str | None = None,
    extra: list[str] | None = None,
    tls_port: int | None = None,
) -> RedisProc:
    binary = redis_binary()
    assert binary is not None
    port = free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--dir", str(dir)]
    args += ["--appendonly", "yes", "--appendfsync", "always"] if aof else ["--appendonly", "no"]
    if password:
        args += ["--requirepass", password]
    return RedisProc(dir, args + list(extra or []), port, tls_port, password)


# ---- worker processes -------------------------------------------------------------------------------------
@dataclass
class WorkerProc:
    consumer: str
    log: Path
    process: subprocess.Popen

    def alive(self) -> bool:
        return self.process.poll() is None

    def lines(self) -> list[dict]:
        out = []
        for line in self.log.read_bytes().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
        return out

    def logged(self, event: str) -> list[dict]:
        return [e for e in self.lines() if e.get("event") == event]

    def wait_started(self, timeout_s: float = 90) -> None:
        def started() -> bool:
            # A worker may start and die before the next poll (a job that kills it): started all the same.
            # Alive is read before the log, so a dead worker's log is complete when it is read.
            alive = self.alive()
            if b'"worker started"' in self.log.read_bytes():
                return True
            if not alive:
                raise AssertionError(f"worker {self.consumer} exited: {self.log.read_text()[-3000:]}")
            return False

        wait_until(started, timeout_s, f"worker {self.consumer} to start", 0.05)

    def kill9(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self, timeout_s: float = 30) -> int:
        if self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)
            return -9


@dataclass
class Workers:
    """Spawns `python -m worker.cli worker` processes; stops every one it spawned at teardown."""

    model: str
    log_dir: Path
    spawned: list[WorkerProc] = field(default_factory=list)

    def spawn(
        self,
        url: str,
        consumer: str,
        *extra: str,
        group: str = GROUP,
        env: dict[str, str] | None = None,
        metrics_port: str | None = "0",  # None: not given, the worker's default
    ) -> WorkerProc:
        args = [sys.executable, "-m", "worker.cli", "worker", "--model", self.model, "--redis-url", url]
        args += ["--consumer", consumer, "--group", group]
        args += ["--metrics-port", metrics_port] if metrics_port is not None else []
        args += ["--num-kv-blocks", "4096", "--max-num-seqs", "24", "--max-num-batched-tokens", "1024"]
        args += ["--lease-ms", "1200", *extra]
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": "1",
            "MKL_NUM_THREADS": "1",
            **(env or {}),
        }
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        log = self.log_dir / f"worker-{consumer}-{len(self.spawned)}.log"
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=open(log, "wb"),
            stdin=subprocess.DEVNULL,
        )
        worker = WorkerProc(consumer, log, proc)
        self.spawned.append(worker)
        return worker

    def stop_all(self) -> None:
        for w in self.spawned:
            if w.alive():
                w.process.send_signal(signal.SIGTERM)
        for w in self.spawned:
            w.stop(timeout_s=20)


# ---- jobs and their streams ---------------------------------------------------------------------------------
def job_payload(job: dict) -> bytes:
    return json.dumps(job).encode()


def greedy_or_sampled(job_id: str, prompt: str, max_tokens: int, k: int, sampled: dict) -> dict:
    """Job k of a mix: greedy when k is even, else the `sampled` parameters; a resumed job of either kind
    must continue exactly where it stopped."""
    job = {"id": job_id, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    job.update({"temperature": 0.0} if k % 2 == 0 else sampled)
    return job


def enqueue_many(client: redis.Redis, jobs: list[dict], keys: Keys = K) -> list[bytes]:
    pipe = client.pipeline(transaction=False)
    for job in jobs:
        pipe.xadd(keys.requests, {JOB_FIELD: job_payload(job)})
    return pipe.execute()


def read_events(client: redis.Redis, job_id: str, keys: Keys = K) -> list[dict]:
    return [json.loads(f[EVENT_FIELD]) for _, f in client.xrange(keys.out(job_id))]


def terminal(events: list[dict]) -> dict | None:
    ends = [e for e in events if e["type"] in ("done", "error")]
    return ends[-1] if ends else None


def wait_terminal(client: redis.Redis, job_ids, timeout_s: float, keys: Keys = K) -> dict[str, list[dict]]:
    """Poll until every job's output stream ends with done/error; returns the events per id."""
    left, found = set(job_ids), {}
    deadline = time.monotonic() + timeout_s
    while left:
        pipe = client.pipeline(transaction=False)
        order = sorted(left)
        for job_id in order:
            pipe.xrevrange(keys.out(job_id), count=1)
        for job_id, last in zip(order, pipe.execute(), strict=True):
            if last and json.loads(last[0][1][EVENT_FIELD])["type"] in ("done", "error"):
                left.discard(job_id)
        if left and time.monotonic() > deadline:
            raise AssertionError(
                f"{len(left)} jobs without a terminal event after {timeout_s}s: {order[:10]}"
            )
        if left:
            time.sleep(0.05)
    for job_id in job_ids:
        found[job_id] = read_events(client, job_id, keys)
    return found


@dataclass
class StreamCheck:
    tokens: list[int]
    text: str
    duplicated: int  # token positions published more than once
    missing: int  # positions absent (gaps, or fewer tokens than the done event counts)
    terminals: int
    end: dict | None


def check_stream(events: list[dict], sample: int | None = None) -> StreamCheck:
    """Exactly-once as the client sees it: the token events' indices cover 0..n-1 once each."""
    seen: dict[int, int] = {}
    text, duplicated = [], 0
    for e in events:
        if e["type"] != "token" or e.get("sample") != sample:
            continue
        for j, t in enumerate(e["token_ids"]):
            pos = e["index"] + j
            if pos in seen:
                duplicated += 1
            else:
                seen[pos] = t
        text.append(e["text"])
    end = terminal(events)
    terminals = sum(e["type"] in ("done", "error") for e in events)
    span = max(seen) + 1 if seen else 0
    if end is not None and end["type"] == "done" and sample is None:
        span = max(span, end["usage"]["completion_tokens"])
    missing = sum(1 for p in range(span) if p not in seen)
    tokens = [seen[p] for p in sorted(seen)]
    return StreamCheck(tokens, "".join(text), duplicated, missing, terminals, end)


def assert_exactly_once(job_id: str, events: list[dict]) -> StreamCheck:
    chk = check_stream(events)
    assert chk.terminals == 1 and events[-1]["type"] in ("done", "error"), (job_id, events[-3:])
    assert chk.duplicated == 0 and chk.missing == 0, (job_id, chk)
    indices = [e["index"] for e in events if e["type"] == "token"]
    assert indices == sorted(set(indices)), (job_id, indices)
    if chk.end["type"] == "done":
        assert chk.end["text"] == chk.text, job_id
        assert chk.end["usage"]["completion_tokens"] == len(chk.tokens), job_id
    return chk


# ---- the expected outputs, from the engine in this process ---------------------------------------------------
_ENGINES: dict[str, object] = {}


def expected_outputs(model: str, jobs: list[dict]) -> dict[str, tuple[list[int], str]]:
    """job id -> (token ids, text) of an uninterrupted LLMEngine.generate run with the job's parameters."""
    import torch

    from engine import LLMEngine, SamplingParams

    torch.set_num_threads(1)  # a 2-core machine shared with worker processes: threads only contend
    engine = _ENGINES.get(model)
    if engine is None:
        engine = _ENGINES[model] = LLMEngine(model, num_kv_blocks=4096, max_num_seqs=24)
    params = [SamplingParams(**{k: v for k, v in job.items() if k not in ("id", "prompt")}) for job in jobs]
    results = engine.generate([job["prompt"] for job in jobs], params)
    return {job["id"]: (list(res.token_ids), res.text) for job, res in zip(jobs, results, strict=True)}
