"""The same greedy workload through the HTTP gateway (N concurrent streaming clients) and through Redis
directly, in one run, on one worker: throughput ratio and the gateway's added latency per token.

    python benchmarks/http_e2e.py --quick               # 64 requests, prompts and outputs <= 128
    python benchmarks/http_e2e.py --model tiny --quick  # the tiny test model

Workload and engine settings are benchmarks/redis_e2e.py's (benchmarks/workload.py). One Worker runs on a
thread (as in `conveyor worker`) with its registry heartbeat, serving the model as "bench":
  redis:   every job XADDed at once; a client process reads every output stream to its terminal event;
  gateway: `conveyor serve` in its own process; a client process runs N concurrent streaming
           /v1/completions requests (prompt token ids, SSE, include_usage), while a second process reads
           the same jobs' output streams from Redis, as in the redis run.
Added latency per token: for each SSE chunk, the time its bytes reached the HTTP client minus the time
the Redis reader's XREAD returned the same token event (the k-th of that job; jobs ask for the sampled
token's logprob, so every event has a chunk). Targets: gateway throughput >= 90% of Redis directly;
added latency p99 < 5 ms. Also reported: the CPU seconds each process spent during each run (the
gateway's from /proc), as the processes share the machine's cores, and the gateway's write system calls
per request (/proc's syscw). Writes JSON to benchmarks/results/.
The engine's thread runs at niceness +19 (`--worker-nice`), as `conveyor worker --nice 19` does in
compose.cpu.yaml, where CPU workers share the host's cores with the gateway and Redis: at equal priority
(`--worker-nice 0`) the gateway's pass waits for a core behind the engine's threads on a small machine,
which is the CPU engine's cost, not the gateway's. The reader and the
HTTP client keep their priority, so neither side of the comparison is favoured.
The HTTP client and the Redis reader, which stand for clients on other machines, run on the last CPU and
the gateway on the others (`--no-pin`: anywhere; benchmarks/cpu_split.py says why), in both runs; the
engine and Redis may use every CPU.
`--replicas N` runs N gateway processes, each on its own port, and the client opens its connections on
them in turn, as a balancer in front of stateless replicas would spread them.

The HTTP client is benchmarks/sse_client.py's (`--client raw`, the default), which stamps
a chunk when its bytes arrive; `--client httpx` is the first one, which stamped a chunk after parsing it
in Python and cost its process more CPU than the gateway spent.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.cpu_split import CpuSplit, pin, run_pinned, split_cpus  # noqa: E402
from benchmarks.kernel_stamps import receive, stamp_arrivals  # noqa: E402
from benchmarks.proc_counters import cpu_seconds, write_calls  # noqa: E402
from benchmarks.redis_e2e import make_engine, percentiles, warm_up  # noqa: E402
from benchmarks.served import add_model_options  # noqa: E402
from benchmarks.workload import bench_model_dir, make_workload  # noqa: E402
from worker import local_redis  # noqa: E402
from worker.cli.logs import configure as configure_logs  # noqa: E402
from worker.cli.niceness import MAX_NICENESS, lower_priority  # noqa: E402
from worker.cli.tiny_model import resolve_model  # noqa: E402
from worker.config import WorkerConfig  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.keys import EVENT_FIELD, Keys  # noqa: E402

MODEL = "bench"


def read_streams(url: str, prefix: str, ids: list[str], ready, result) -> None:
    """Client process: every output stream from its start to its terminal event; per job, the time each
    token event was read (its XREAD reply complete and parsed) and the kernel's receive time of the
    reply's first bytes (benchmarks/kernel_stamps.py). A plain socket speaking RESP, so that the kernel's
    stamps can be read; hiredis parses."""
    reader = _RespReader(url)
    keys = Keys(prefix)
    cursors = {keys.out(i).encode(): b"0" for i in ids}
    tokens = 0
    seen: dict[str, list[float]] = {i: [] for i in ids}
    seen_kernel: dict[str, list[float]] = {i: [] for i in ids}
    ready.set()
    cpu = None
    while cursors:
        reply, now, kernel = reader.command(
            b"XREAD", b"COUNT", b"1000", b"BLOCK", b"5000", b"STREAMS", *cursors, *cursors.values()
        )
        cpu = time.process_time() if cpu is None else cpu
        for key, entries in reply or []:
            job_id = key.decode().rsplit(":", 1)[-1]
            for entry_id, fields in entries:
                event = json.loads(dict(zip(fields[::2], fields[1::2], strict=True))[EVENT_FIELD])
                cursors[key] = entry_id
                if event["type"] == "token":
                    tokens += len(event["token_ids"])
                    seen[job_id].append(now)
                    seen_kernel[job_id].append(kernel)
                else:
                    cursors.pop(key)
                    break
    result.put((tokens, time.perf_counter(), seen, seen_kernel, time.process_time() - (cpu or 0.0)))


class _RespReader:
    """A blocking RESP2 connection to a plain-TCP Redis (AUTH and SELECT from the URL; no TLS)."""

    def __init__(self, url: str) -> None:
        import socket

        import hiredis

        options = redis.connection.parse_url(url)
        if url.startswith("rediss://") or "path" in options:
            raise SystemExit("benchmarks/http_e2e.py reads the streams over plain TCP: give a redis:// URL")
        self.sock = socket.create_connection((options.get("host", "localhost"), options.get("port", 6379)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stamp_arrivals(self.sock)
        self.parser, self.pack = hiredis.Reader(), hiredis.pack_command
        if options.get("password"):
            auth = [options["username"]] if options.get("username") else []
            self.command(b"AUTH", *auth, options["password"])
        if options.get("db"):
            self.command(b"SELECT", str(options["db"]))

    def command(self, *args) -> tuple[Any, float, float]:
        """The reply; when this process had it parsed; when the kernel received its first bytes."""
        self.sock.sendall(self.pack(args))
        first = None
        while True:
            data, kernel = receive(self.sock)
            if not data:
                raise ConnectionError("Redis closed the connection")
            if first is None:
                first = time.time() if kernel is None else kernel
            self.parser.feed(data)
            reply = self.parser.gets()
            if reply is not False:
                if isinstance(reply, Exception):  # hiredis hands an error reply back, it does not raise it
                    raise reply
                return reply, time.time(), first


def raw_clients(base: str, requests: list[tuple[str, dict]], clients: int, ready, go, result) -> None:
    """Client process (`--client raw`): benchmarks/sse_client.py's, on uvloop as the gateway runs."""
    import uvloop

    from benchmarks.sse_client import stream_all

    host, ports = base.removeprefix("http://").split(":")  # "host:port[,port...]": one per replica
    ports_ = [int(port) for port in ports.split(",")]
    result.put(uvloop.run(stream_all(host, ports_, requests, clients, ready, go)))


def http_clients(base: str, requests: list[tuple[str, dict]], clients: int, ready, go, result) -> None:
    """Client process (`--client httpx`): `clients` concurrent streaming requests; per job, the read time
    of each chunk, taken after its line was split and parsed."""
    import httpx

    async def main() -> tuple[int, float, dict, None, float]:
        limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
        seen: dict[str, list[float]] = {}
        tokens = 0
        gate = asyncio.Semaphore(clients)
        async with httpx.AsyncClient(base_url=base, limits=limits, timeout=600) as http:

            async def one(job_id: str, body: dict) -> None:
                nonlocal tokens
                times = seen.setdefault(job_id, [])
                async with (
                    gate,
                    http.stream(
                        "POST", "/v1/completions", json=body, headers={"X-Request-Id": job_id}
                    ) as answer,
                ):
                    assert answer.status_code == 200, await answer.aread()
                    async for line in answer.aiter_lines():
                        if not line.startswith("data: ") or line == "data: [DONE]":
                            continue
                        chunk = json.loads(line[6:])
                        if chunk.get("usage"):
                            tokens += chunk["usage"]["completion_tokens"]
                        if chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
                            times.append(time.time())

            ready.set()
            go.wait()
            cpu = time.process_time()
            await asyncio.gather(*(one(job_id, body) for job_id, body in requests))
        return tokens, time.perf_counter(), seen, None, time.process_time() - cpu  # no kernel stamps

    result.put(asyncio.run(main()))


def start_worker(args, url: str, keys: Keys):
    from worker.cli.main import registry_heartbeat
    from worker.run.hooks import Tracer
    from worker.run.loop import Worker

    engine = make_engine(args)
    warm_up(engine, args.workload)
    client = connect(url)
    cfg = WorkerConfig(group=MODEL, consumer="bench-1", keys=keys)
    tracer = Tracer()
    worker = Worker(engine, client, cfg, hooks=tracer)
    worker.observer.heartbeat = registry_heartbeat(client, cfg, engine, args.model, worker)

    def run() -> None:
        # This thread only: the processes that measure (started by the main thread) keep their priority.
        lower_priority(args.worker_nice, whole_process=False)
        worker.run()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return worker, thread


def job_body(job) -> dict:
    return {
        "model": MODEL,
        "prompt": job.prompt_token_ids,
        "max_tokens": job.max_tokens,
        "temperature": 0.0,
        "ignore_eos": True,
        # The sampled token's logprob: every token event then has a chunk of its own (an event whose text is
        # held back has none without it), so chunks and events pair one to one. Both runs ask for it.
        "logprobs": 0,
    }


def run_redis(url: str, keys: Keys, workload, ctx, cpus: CpuSplit | None) -> dict:
    ids = [f"r{k}" for k in range(len(workload))]
    ready, result = ctx.Event(), ctx.Queue()
    measurers = None if cpus is None else cpus.measurers
    reader = ctx.Process(
        target=run_pinned, args=(measurers, read_streams, url, keys.prefix, ids, ready, result)
    )
    reader.start()
    ready.wait(60)
    client = connect(url)
    start, cpu = time.perf_counter(), time.process_time()
    pipe = client.pipeline(transaction=False)
    for job_id, job in zip(ids, workload, strict=True):
        body = {k: v for k, v in job_body(job).items() if k not in ("model", "prompt")}
        pipe.xadd(
            keys.requests,
            {b"job": json.dumps({"id": job_id, "prompt_token_ids": job.prompt_token_ids, **body})},
        )
    pipe.execute()
    tokens, end, _, _, reader_cpu = result.get(timeout=900)
    reader.join()
    return {
        "tokens": tokens,
        "seconds": end - start,
        "tokens_per_s": tokens / (end - start),
        "cpu_s": {"redis_reader": reader_cpu, "engine_process": time.process_time() - cpu},
    }


def replicas_total(serves: list[subprocess.Popen], of: Callable[[int], float | None]) -> float | None:
    """`of(pid)` summed over the gateway replicas (None where /proc cannot tell)."""
    each = [of(serve.pid) for serve in serves]
    return None if None in each else sum(each)  # type: ignore[arg-type]


def run_gateway(
    url: str,
    keys: Keys,
    workload,
    clients: int,
    ctx,
    client_kind: str,
    replicas: int = 1,
    cpus: CpuSplit | None = None,
) -> dict:
    from worker.local_redis import free_port

    # Replicas behind no balancer: the client opens its connections on their ports in turn.
    ports = [free_port() for _ in range(replicas)]
    root = str(Path(__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", "")}
    serve_cmd = [sys.executable, "-m", "worker.cli", "serve", "--redis-url", url,
                 "--prefix", keys.prefix, "--log-level", "warning"]  # fmt: skip
    serves = [
        subprocess.Popen([*serve_cmd, "--port", str(port)], cwd=root, env=env, stdin=subprocess.DEVNULL)
        for port in ports
    ]
    measurers = None if cpus is None else cpus.measurers
    try:
        import httpx

        deadline = time.monotonic() + 60
        while True:
            try:
                if all(
                    httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
                    for port in ports
                ):
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or any(serve.poll() is not None for serve in serves):
                raise RuntimeError("the gateway did not start")
            time.sleep(0.1)
        time.sleep(1.0)  # the registry record is read at most every 0.5 s
        ids = [f"g{k}" for k in range(len(workload))]
        requests = [(job_id, job_body(job)) for job_id, job in zip(ids, workload, strict=True)]
        for _, body in requests:
            body.update(stream=True, stream_options={"include_usage": True})
        ready_r, result_r = ctx.Event(), ctx.Queue()
        if cpus is not None:
            for serve in serves:  # every thread it has; those started later inherit their creator's CPUs
                pin(serve.pid, cpus.served)
        reader = ctx.Process(
            target=run_pinned, args=(measurers, read_streams, url, keys.prefix, ids, ready_r, result_r)
        )
        ready_h, go, result_h = ctx.Event(), ctx.Event(), ctx.Queue()
        base = "http://127.0.0.1:" + ",".join(map(str, ports))
        target = raw_clients if client_kind == "raw" else http_clients
        client = ctx.Process(
            target=run_pinned, args=(measurers, target, base, requests, clients, ready_h, go, result_h)
        )
        reader.start()
        client.start()
        ready_r.wait(60)
        ready_h.wait(60)
        start, cpu, serve_cpu = time.perf_counter(), time.process_time(), replicas_total(serves, cpu_seconds)
        serve_writes = replicas_total(serves, write_calls)
        go.set()
        tokens, end, http_seen, http_kernel, client_cpu = result_h.get(timeout=900)
        serve_cpu_end = replicas_total(serves, cpu_seconds)
        serve_writes_end = replicas_total(serves, write_calls)
        _, _, redis_seen, redis_kernel, reader_cpu = result_r.get(timeout=120)
        cpu = time.process_time() - cpu
        client.join()
        reader.join()
    finally:
        for serve in serves:
            serve.terminate()
            serve.wait(timeout=30)
    added, first, later, unmatched = _added(http_seen, redis_seen)
    kernel = None if http_kernel is None else _added(http_kernel, redis_kernel)[0]
    return {
        "tokens": tokens,
        "seconds": end - start,
        "tokens_per_s": tokens / (end - start),
        "clients": clients,
        "client": client_kind,
        "replicas": replicas,
        "added_latency_ms": percentiles(added),
        # Each request's first chunk: it waits for the answer to start, and for the gateway to finish
        # taking in the requests that arrived with it (with 64 requests, 64 of about 3000 chunks).
        "added_latency_ms_first_chunk": percentiles(first),
        "added_latency_ms_later_chunks": percentiles(later),
        # The same pairs stamped by the kernel on arrival at each reader's socket (the raw client only):
        # neither reader's own queue counts (benchmarks/kernel_stamps.py). Not what the target is set on.
        "added_latency_ms_kernel_stamps": None if kernel is None else percentiles(kernel),
        "unmatched_chunks": unmatched,
        "cpu_s": {
            "gateway": None if serve_cpu is None or serve_cpu_end is None else serve_cpu_end - serve_cpu,
            "http_client": client_cpu,
            "redis_reader": reader_cpu,
            "engine_process": cpu,
        },
        # The gateway's write system calls during the run, per request: each one a socket write (to a
        # client or to Redis), each costing a few µs and, on loopback, the receiver's side of TCP too.
        "gateway_writes_per_request": None
        if serve_writes is None or serve_writes_end is None
        else (serve_writes_end - serve_writes) / len(requests),
    }


def _added(http_seen: dict, redis_seen: dict) -> tuple[list[float], list[float], list[float], int]:
    """Per token, its chunk's time minus its event's (the k-th of each job), sorted: all of them, each
    job's first, the later ones; and how many had no partner."""
    added, first, later, unmatched = [], [], [], 0
    for job_id, times in http_seen.items():
        direct = redis_seen.get(job_id, [])
        unmatched += abs(len(times) - len(direct))
        pairs = [h - r for h, r in zip(times, direct, strict=False)]
        added.extend(pairs)
        first.extend(pairs[:1])
        later.extend(pairs[1:])
    for values in (added, first, later):
        values.sort()
    return added, first, later, unmatched


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_options(parser, "bench")  # and "bench", the default: benchmarks/workload.py's 50M Llama
    parser.add_argument("--num-requests", type=int, default=256)
    parser.add_argument("--max-prompt", type=int, default=512)
    parser.add_argument("--max-output", type=int, default=512)
    parser.add_argument("--quick", action="store_true", help="64 requests, prompts <= 128, outputs <= 128")
    parser.add_argument("--clients", type=int, default=64, help="concurrent streaming HTTP clients")
    parser.add_argument(
        "--client", choices=("raw", "httpx"), default="raw", help="the HTTP client (see above)"
    )
    parser.add_argument(
        "--replicas", type=int, default=1,
        help="gateway processes, each on its port; the raw client opens its connections on them in turn",
    )  # fmt: skip
    parser.add_argument("--max-batch", type=int, default=64)
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-blocks", type=int, default=4096)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--redis-url", default=None, help="default: start a local redis-server")
    parser.add_argument("--torch-threads", type=int, default=0)
    parser.add_argument(
        "--worker-nice", type=int, default=MAX_NICENESS, choices=range(MAX_NICENESS + 1), metavar="0-19",
        help="the engine thread's niceness increment, as `conveyor worker --nice` (compose.cpu.yaml: 19); "
        "0 computes at the gateway's priority",
    )  # fmt: skip
    parser.add_argument(
        "--pin", action=argparse.BooleanOptionalAction, default=True,
        help="the HTTP client and the Redis reader on the last CPU, the gateway on the others "
        "(benchmarks/cpu_split.py; nothing is pinned with fewer than two CPUs)",
    )  # fmt: skip
    parser.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "conveyor")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    if args.replicas < 1 or (args.replicas > 1 and args.client != "raw"):
        parser.error("--replicas takes a count >= 1, and more than one needs --client raw")
    configure_logs("info")  # the worker logs as `conveyor worker` does: debug lines filtered, not printed
    if args.quick:
        args.num_requests, args.max_prompt, args.max_output = 64, 128, 128
    model_name = args.model
    args.model = (
        str(bench_model_dir(args.model_cache)) if args.model == "bench" else resolve_model(args.model)
    )
    vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
    args.workload = make_workload(
        args.num_requests, max_prompt=args.max_prompt, max_output=args.max_output, vocab_size=vocab
    )
    import torch

    torch.manual_seed(0)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    server = None
    url = args.redis_url
    if url is None:
        server = local_redis.start()
        url = server.url
    keys = Keys(prefix=f"bench-{os.getpid()}", served_model=MODEL)
    ctx = mp.get_context("spawn")
    cpus = split_cpus() if args.pin else None
    worker, thread = start_worker(args, url, keys)
    try:
        print(f"{len(args.workload)} requests; through redis ...", flush=True)
        direct = run_redis(url, keys, args.workload, ctx, cpus)
        print(
            f"  {direct['tokens_per_s']:.1f} tok/s; through the gateway ({args.clients} clients) ...",
            flush=True,
        )
        gateway = run_gateway(url, keys, args.workload, args.clients, ctx, args.client, args.replicas, cpus)
    finally:
        worker.stop.request()
        thread.join(timeout=60)
        if server is not None:
            server.stop()
    ratio = gateway["tokens_per_s"] / direct["tokens_per_s"]
    lat = gateway["added_latency_ms"]
    report = {
        "model": model_name,
        "num_requests": len(args.workload),
        "max_prompt": args.max_prompt,
        "max_output": args.max_output,
        "torch_threads": torch.get_num_threads(),
        "worker_nice": args.worker_nice,
        "cpus": None if cpus is None else cpus.as_json(),
        "cpu_count": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "redis": direct,
        "gateway": gateway,
        "throughput_ratio": ratio,
        "targets": {"ratio>=0.9": ratio >= 0.9, "added_p99_ms<5": lat["p99"] < 5.0},
    }
    print(
        f"redis    {direct['tokens_per_s']:10.1f} tok/s  ({direct['tokens']} tokens in {direct['seconds']:.2f} s)"
    )
    print(
        f"gateway  {gateway['tokens_per_s']:10.1f} tok/s  ({gateway['tokens']} tokens in {gateway['seconds']:.2f} s)"
    )
    print(
        f"ratio    {ratio:10.3f}  (target >= 0.90; {args.replicas} gateway replica(s); "
        f"engine at niceness +{args.worker_nice}; "
        + ("nothing pinned)" if cpus is None else f"measurers on CPU {sorted(cpus.measurers)})")
    )
    print("cpu s    " + "  ".join(f"{k} {v:.2f}" for k, v in gateway["cpu_s"].items() if v is not None))
    if gateway["gateway_writes_per_request"] is not None:
        print(f"gateway write system calls per request  {gateway['gateway_writes_per_request']:.2f}")
    print(
        f"added per token  p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  max {lat['max']:.2f} ms  (target p99 < 5 ms)"
    )
    for name in ("first_chunk", "later_chunks", "kernel_stamps"):
        if (part := gateway[f"added_latency_ms_{name}"]) is not None:
            print(
                f"  {name:14s} p50 {part['p50']:.2f} ms  p99 {part['p99']:.2f} ms  max {part['max']:.2f} ms"
            )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"http_e2e-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
