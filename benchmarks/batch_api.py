"""The HTTP Batch API (`/v1/files` + `/v1/batches`, driven under a lease by a gateway replica) against
`conveyor batch` (the same runner writing a local file), on the same worker and the same lines, in one run.

    python benchmarks/batch_api.py                 # 400 chat lines, 16 greedy tokens each, tiny model
    python benchmarks/batch_api.py --lines 2000 --max-tokens 32 --model ./my-model
    python benchmarks/batch_api.py --quick --out /tmp/b.json   # 4 lines of 2 tokens: checks it runs

What the durable driver adds per line: one Lua call (lease check, SADD, RPUSH, HINCRBY), the status checks
every 0.25 s, and at the end the output file written into Redis. Prints both wall times, lines per second
and their ratio (target: the Batch API >= 0.9 of `conveyor batch`); JSON to --out
(default benchmarks/results/batch_api.json).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker import local_redis  # noqa: E402
from worker.batch.runner import BatchRunner  # noqa: E402
from worker.cli.tiny_model import resolve_model  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.job_queue import SingleQueue  # noqa: E402
from worker.local_redis import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SERVED = "bench"


def lines(n: int, max_tokens: int, tag: str) -> bytes:
    out = []
    for i in range(n):
        messages = [{"role": "user", "content": f"request {i} of run {tag}"}]
        body = {"model": SERVED, "messages": messages, "max_tokens": max_tokens, "temperature": 0}
        out.append({"custom_id": f"{tag}-{i}", "method": "POST", "url": "/v1/chat/completions", "body": body})
    return "".join(json.dumps(x) + "\n" for x in out).encode()


def spawn(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"))


def wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lines", type=int, default=400, help="chat requests in each run's input file")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--max-in-flight", type=int, default=256)
    ap.add_argument("--quick", action="store_true", help="4 lines of 2 tokens")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "batch_api.json")
    args = ap.parse_args()
    if args.quick:
        args.lines, args.max_tokens = 4, 2
    import httpx
    from openai import OpenAI

    work = Path(os.environ.get("TMPDIR", "/tmp")) / f"batch_api_bench_{os.getpid()}"
    work.mkdir(parents=True)
    server = local_redis.start()
    model = resolve_model(args.model)
    py = sys.executable
    worker = spawn(
        [py, "-m", "worker.cli", "worker", "--model", model, "--redis-url", server.url, "--served-model-name",
         SERVED, "--metrics-port", "0", "--consumer", "w1"],
        work / "worker.log",
    )  # fmt: skip
    port = free_port()
    gateway = spawn(
        [py, "-m", "worker.cli", "serve", "--redis-url", server.url, "--port", str(port),
         "--batch-max-in-flight", str(args.max_in_flight), "--batch-poll-s", "0.1"],
        work / "gateway.log",
    )  # fmt: skip
    try:
        wait(lambda: b'"worker started"' in (work / "worker.log").read_bytes(), 300, "the worker")

        def healthy() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        wait(healthy, 60, "the gateway")
        # Warm-up: a few lines through the CLI runner (compiles nothing, but loads the chat template path).
        queue = SingleQueue(connect(server.url), _keys())
        (work / "warm.jsonl").write_bytes(lines(8, args.max_tokens, "warm"))
        BatchRunner(queue, progress=False).run(str(work / "warm.jsonl"), str(work / "warm.out"))

        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)

        def via_cli(tag: str) -> float:
            (work / f"{tag}.jsonl").write_bytes(lines(args.lines, args.max_tokens, tag))
            t0 = time.perf_counter()
            runner = BatchRunner(queue, max_in_flight=args.max_in_flight, progress=False)
            summary = runner.run(str(work / f"{tag}.jsonl"), str(work / f"{tag}.out"))
            assert summary.done == args.lines, summary
            return time.perf_counter() - t0

        def via_http(tag: str) -> float:
            data = lines(args.lines, args.max_tokens, tag)
            t0 = time.perf_counter()
            f = client.files.create(file=("in.jsonl", io.BytesIO(data)), purpose="batch")
            b = client.batches.create(
                input_file_id=f.id, endpoint="/v1/chat/completions", completion_window="24h"
            )
            while b.status not in ("completed", "failed", "expired", "cancelled"):
                time.sleep(0.05)
                b = client.batches.retrieve(b.id)
            assert (
                b.status == "completed" and b.request_counts and b.request_counts.completed == args.lines
            ), b
            return time.perf_counter() - t0

        # A B B A: a machine whose load drifts during the run weighs on both sides alike.
        cli_runs, http_runs = [via_cli("cli1")], [via_http("http1")]
        http_runs.append(via_http("http2"))
        cli_runs.append(via_cli("cli2"))
        cli_s, http_s = sum(cli_runs) / 2, sum(http_runs) / 2
    finally:
        for proc in (gateway, worker):
            proc.send_signal(signal.SIGTERM)
        for proc in (gateway, worker):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        server.stop()
    result = {
        "lines": args.lines,
        "max_tokens": args.max_tokens,
        "model": args.model,
        "conveyor_batch_s": [round(x, 3) for x in cli_runs],
        "batch_api_s": [round(x, 3) for x in http_runs],
        "conveyor_batch_lines_per_s": round(args.lines / cli_s, 1),
        "batch_api_lines_per_s": round(args.lines / http_s, 1),
        "ratio": round(cli_s / http_s, 3),
    }
    print(f"{'':24}{'conveyor batch':>16}{'Batch API':>12}")
    print(f"{'wall s (mean of 2)':24}{cli_s:16.2f}{http_s:12.2f}")
    print(f"{'lines/s':24}{args.lines / cli_s:16.1f}{args.lines / http_s:12.1f}")
    print(f"Batch API / conveyor batch throughput: {cli_s / http_s:.3f} (target >= 0.9)")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


def _keys():
    from worker.keys import Keys

    return Keys(served_model=SERVED)


if __name__ == "__main__":
    main()
