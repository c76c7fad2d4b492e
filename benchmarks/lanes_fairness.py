"""What priority and tenant lanes change for the job that waits behind a flood, side by side with one stream.

    python benchmarks/lanes_fairness.py                 # tiny model, batch 4, outputs of 8 tokens
    python benchmarks/lanes_fairness.py --flood 400     # a longer flood
    python benchmarks/lanes_fairness.py --quick --out /tmp/l.json  # a flood of 8, 2 tokens: checks it runs

Two scenarios, each run twice on the same engine settings (a Worker on one stream, then a lanes worker,
run/build.py), on a redis-server of its own:
- priority: `--flood` jobs of priority 10 queued, then one of priority 0: that job's time from enqueue
  to done (total_ms), with `--priority-lanes 0,10` against one stream;
- tenants: tenant a queues `--flood` jobs, then tenant b 20: b's time to first token (mean, max) and to
  its last done, with `--tenant-weight a=1 --tenant-weight b=1` against one stream.
Prints one line per figure with the ratio one stream / lanes, and writes JSON (default
benchmarks/results/lanes_fairness.json).
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

from tests.helpers.rel_helpers import wait_terminal  # noqa: E402
from worker import local_redis  # noqa: E402
from worker.cli.tiny_model import resolve_model  # noqa: E402
from worker.client import enqueue  # noqa: E402
from worker.config import WorkerConfig  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.intake.lane_layout import priority_layout, tenant_layout  # noqa: E402
from worker.keys import Keys  # noqa: E402
from worker.run.build import build  # noqa: E402

KEYS = Keys()


def job(job_id: str, tokens: int, **fields) -> dict:
    return {
        "id": job_id,
        "prompt_token_ids": [5, 6, 7, 8],
        "max_tokens": tokens,
        "ignore_eos": True,
        **fields,
    }


def serve(args, url: str, layout, jobs_first: list[dict], jobs_then: list[dict], weights=None) -> dict:
    """Queue jobs_first, start a worker, queue jobs_then once it has admitted a batch, wait for
    jobs_then; returns each of jobs_then's done event."""
    from engine import LLMEngine

    client = connect(url)
    client.flushall()
    engine = LLMEngine(args.model, max_num_seqs=args.batch, num_kv_blocks=256, max_num_batched_tokens=512)
    cfg = WorkerConfig(group="bench", consumer="b1", lease_ms=3000)
    worker = build(engine, client, cfg, layout, weights)
    for j in jobs_first:
        enqueue(client, j, KEYS)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while jobs_first and engine.stats().num_running == 0:  # the flood is being served
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the worker did not start serving the flood")
            time.sleep(0.005)
        time.sleep(0.2)
        for j in jobs_then:
            enqueue(client, j, KEYS)
        done = wait_terminal(client, [j["id"] for j in jobs_then], timeout_s=600, keys=KEYS)
    finally:
        worker.stop.cold.set()
        thread.join(timeout=60)
    return {job_id: events[-1] for job_id, events in done.items()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--flood", type=int, default=200, help="jobs queued ahead of the measured ones")
    parser.add_argument("--batch", type=int, default=4, help="the engine's max_num_seqs")
    parser.add_argument("--tokens", type=int, default=8, help="output tokens per job")
    parser.add_argument("--quick", action="store_true", help="a flood of 8 jobs of 2 tokens")
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent / "results" / "lanes_fairness.json"
    )
    args = parser.parse_args()
    if args.quick:
        args.flood, args.tokens = 8, 2
    args.model = resolve_model(args.model)
    server = local_redis.start()
    results: dict[str, dict] = {}
    try:
        bulk = [job(f"bulk{i}", args.tokens, priority=10) for i in range(args.flood)]
        urgent = [job("urgent", args.tokens)]
        for name, layout in (("one stream", None), ("priority lanes", priority_layout(KEYS, [0, 10]))):
            done = serve(args, server.url, layout, bulk, urgent)
            results.setdefault("priority 0 behind a flood: total_ms", {})[name] = done["urgent"]["timing"][
                "total_ms"
            ]
        flood = [job(f"a{i}", args.tokens, tenant="a") for i in range(args.flood)]
        later = [job(f"b{i}", args.tokens, tenant="b") for i in range(20)]
        for name, layout in (("one stream", None), ("tenant lanes", tenant_layout(KEYS, ["a", "b"]))):
            done = serve(args, server.url, layout, flood, later, {"a": 1, "b": 1})
            ttft = [d["timing"]["ttft_ms"] for d in done.values()]
            for figure, value in (
                ("tenant b ttft_ms mean", statistics.mean(ttft)),
                ("tenant b ttft_ms max", max(ttft)),
                ("tenant b last done total_ms", max(d["timing"]["total_ms"] for d in done.values())),
            ):
                results.setdefault(figure, {})[name] = value
        # Throughput with idle lanes beside the busy one: the flood alone, start to last done.
        for name, layout in (("one stream", None), ("tenant lanes", tenant_layout(KEYS, ["a", "b"]))):
            started = time.monotonic()
            serve(args, server.url, layout, [], flood)
            results.setdefault("flood alone: jobs/s", {})[name] = args.flood / (time.monotonic() - started)
    finally:
        server.stop()
    for figure, by in results.items():
        (one, base), (lanes, value) = (
            [(k, v) for k, v in by.items() if k == "one stream"][0],
            [(k, v) for k, v in by.items() if k != "one stream"][0],
        )
        print(f"{figure:34s} {one}: {base:9.1f}   {lanes}: {value:9.1f}   ratio {base / value:6.1f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    report = {"args": vars(args), "results": results}
    args.out.write_text(json.dumps(report, indent=1, default=str))  # default: the Path in args


if __name__ == "__main__":
    main()
