"""End-to-end throughput through Redis against the same workload on LLMEngine directly, in one run.

    python benchmarks/redis_e2e.py                      # the engine benchmark's workload and ~50M model
    python benchmarks/redis_e2e.py --quick              # 64 requests, prompts and outputs <= 128
    python benchmarks/redis_e2e.py --model tiny         # the tiny test model (steps of a few ms)
    python benchmarks/redis_e2e.py --model smollm2-135m-instruct --lengths eos   # a real model, chat prompts

The workload is benchmarks/throughput.py's (`make_workload`, `bench_model_dir`: 256 requests, prompts
16-512 tokens, heavy-tailed outputs, greedy with ignore_eos), with the same engine settings (batch 64,
2048 batched tokens, 4096 KV blocks of 16, float32). Any other --model (short name, .gguf, folder, tiny)
gets chat prompts rendered with its chat template (benchmarks/chat_workload.py), answers ending at EOS
capped at --max-output (`--lengths eos`, the default: real lengths) or exactly --max-output tokens
(`--lengths fixed`). `--quantization` is passed to the engine; the JSON says what it served.
Direct: add every request to an LLMEngine, step until done. Through Redis: a Worker (on a thread, as in
`conveyor worker`) serves the same requests submitted as jobs (`prompt_token_ids`), while a separate
client process reads every output stream to its terminal event. Both engines are built the same way,
with the same torch threads, and warmed up first.
Latency: from step() returning a token to the client process having read its event (sample->client),
with up to 64 streams live; also to the MULTI/EXEC that wrote it being answered (sample->EXEC).
Targets: Redis throughput >= 90% of direct; sample->client p99 < 5 ms. Writes JSON to benchmarks/results/.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.chat_workload import LENGTHS, chat_jobs  # noqa: E402
from benchmarks.served import add_model_options, quantization_options, resolve, served  # noqa: E402
from benchmarks.workload import Job, bench_model_dir, make_workload  # noqa: E402
from worker import local_redis  # noqa: E402
from worker.cli.logs import configure as configure_logs  # noqa: E402
from worker.config import WorkerConfig  # noqa: E402
from worker.connection import connect  # noqa: E402
from worker.keys import EVENT_FIELD, Keys  # noqa: E402


def make_engine(args):
    from engine import LLMEngine

    return LLMEngine(
        args.model,
        max_num_seqs=args.max_batch,
        max_num_batched_tokens=args.max_batched_tokens,
        num_kv_blocks=args.kv_blocks,
        block_size=16,
        dtype="float32",
        device=args.device,
        **quantization_options(args.quantization),
    )


def params(job: Job):
    from engine import SamplingParams

    return SamplingParams(max_tokens=job.max_tokens, temperature=0.0, ignore_eos=job.ignore_eos)


def warm_up(engine, jobs: list[Job]) -> None:
    engine.generate([list(j.prompt_token_ids) for j in jobs[:4]], params(Job([], 4)))


def run_direct(args) -> dict:
    # On a thread, like the worker's engine: on the CPU, torch's intra-op threading behaves very
    # differently on the main thread of a loaded machine, which would skew the comparison.
    out: dict = {}
    thread = threading.Thread(target=lambda: out.update(_direct(args)))
    thread.start()
    thread.join()
    return out


def _direct(args) -> dict:
    engine = make_engine(args)
    args.served = served(engine)
    warm_up(engine, args.workload)
    start = time.perf_counter()
    for k, job in enumerate(args.workload):
        engine.add_request(f"d{k}", list(job.prompt_token_ids), params(job))
    tokens = 0
    while engine.has_unfinished_requests():
        tokens += sum(len(d.new_token_ids) for d in engine.step())
    elapsed = time.perf_counter() - start
    return {"tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}


def consume(url: str, prefix: str, ids: list[str], ready, result) -> None:
    """Client process: read every output stream from its start until its terminal event."""
    client = connect(url)
    keys = Keys(prefix)
    cursors = {keys.out(i): b"0" for i in ids}
    tokens, arrivals = 0, {}
    ready.set()
    while cursors:
        reply = client.xread(dict(cursors), block=5000, count=1000) or []
        for key, entries in reply:
            key = key.decode()
            for entry_id, fields in entries:
                event = json.loads(fields[EVENT_FIELD])
                cursors[key] = entry_id
                if event["type"] == "token":
                    tokens += len(event["token_ids"])
                    arrivals[(key.rsplit(":", 1)[-1], event.get("sample", 0), event["index"])] = time.time()
                else:
                    cursors.pop(key)
                    break
    result.put((tokens, time.perf_counter(), arrivals))


def run_redis(args, url: str) -> dict:
    from worker.run.hooks import Tracer
    from worker.run.loop import Worker

    engine = make_engine(args)
    warm_up(engine, args.workload)
    prefix = f"bench-{os.getpid()}-{int(time.time())}"
    keys = Keys(prefix)
    tracer = Tracer()
    cfg = WorkerConfig(group="bench", consumer="bench-1", keys=keys)
    worker = Worker(engine, connect(url), cfg, hooks=tracer)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    ids = [f"b{k}" for k in range(len(args.workload))]
    ctx = mp.get_context("spawn")
    ready, result = ctx.Event(), ctx.Queue()
    reader = ctx.Process(target=consume, args=(url, prefix, ids, ready, result))
    reader.start()
    ready.wait(60)
    client = connect(url)
    time.sleep(0.5)  # let the idle worker block in XREADGROUP, as in service
    tracer.publish_latencies.clear()
    tracer.trace.clear()
    payloads = [
        json.dumps(
            {
                "id": job_id,
                "prompt_token_ids": job.prompt_token_ids,
                "max_tokens": job.max_tokens,
                "temperature": 0.0,
                "ignore_eos": job.ignore_eos,
            }
        )
        for job_id, job in zip(ids, args.workload, strict=True)
    ]
    start = time.perf_counter()
    pipe = client.pipeline(transaction=False)
    for payload in payloads:
        pipe.xadd(keys.requests, {b"job": payload})
    pipe.execute()
    tokens, end, arrivals = result.get(timeout=600)
    reader.join()
    # Sampled (step() returned it) -> read by the client process from its output stream.
    e2e = sorted(arrivals[(j, k, i)] - t for j, k, i, t in tracer.trace if (j, k, i) in arrivals)
    latencies = sorted(tracer.publish_latencies)
    worker.stop.request()
    thread.join(timeout=60)
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)
    elapsed = end - start

    return {
        "tokens": tokens,
        "seconds": elapsed,
        "tokens_per_s": tokens / elapsed,
        # sample -> the worker's MULTI/EXEC answered (per round; an upper bound on "written")
        "publish_latency_ms": percentiles(latencies),
        # sample -> a separate client process read the event (per token event, all streams live)
        "sample_to_client_ms": percentiles(e2e),
    }


def percentiles(values: list[float]) -> dict:
    def pct(q: float) -> float:
        return values[min(len(values) - 1, int(q * len(values)))] * 1000 if values else float("nan")

    return {"p50": pct(0.5), "p99": pct(0.99), "max": pct(1.0), "count": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_model_options(parser, default="bench")
    parser.add_argument(
        "--lengths",
        choices=LENGTHS,
        help="chat prompts (any --model but bench): answers end at EOS capped at --max-output (eos, the "
        "default), or are exactly --max-output tokens (fixed)",
    )
    parser.add_argument("--num-requests", type=int, help="default 256 (--quick: 64)")
    parser.add_argument("--max-prompt", type=int, help="random prompts: default 512 (--quick: 128)")
    parser.add_argument("--max-output", type=int, help="default 512 (--quick: 128)")
    parser.add_argument(
        "--quick", action="store_true", help="64 requests, prompts <= 128, outputs <= 128 (unless given)"
    )
    parser.add_argument("--max-batch", type=int, default=64, help="max_num_seqs: concurrent streams")
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-blocks", type=int, default=4096, help="KV pool in blocks of 16 tokens")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--redis-url", default=None, help="default: start a local redis-server")
    parser.add_argument(
        "--repeats", type=int, default=1, help="alternate direct/redis runs; medians reported"
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=0,
        help="torch.set_num_threads for both runs (0: torch's default, one per core)",
    )
    parser.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "conveyor")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = parser.parse_args()
    configure_logs("info")  # the worker logs as `conveyor worker` does: debug lines filtered, not printed
    for name, full, quick in (("num_requests", 256, 64), ("max_prompt", 512, 128), ("max_output", 512, 128)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    chat = args.model != "bench"
    if not chat and args.lengths is not None:
        parser.error("--lengths applies to chat prompts: give a real model with --model")
    args.lengths = args.lengths or ("eos" if chat else "fixed")
    if chat:
        from engine.tokenizer import load_tokenizer

        args.model = resolve(args.model)
        args.workload = chat_jobs(
            load_tokenizer(args.model), args.num_requests, args.max_output, args.lengths
        )
    else:
        args.model = str(bench_model_dir(args.model_cache))
        vocab = json.loads((Path(args.model) / "config.json").read_text())["vocab_size"]
        args.workload = make_workload(
            args.num_requests, max_prompt=args.max_prompt, max_output=args.max_output, vocab_size=vocab
        )
    import torch

    torch.manual_seed(0)
    if args.torch_threads:
        torch.set_num_threads(args.torch_threads)
    print(
        f"workload: {len(args.workload)} requests, "
        f"prompt tokens {sum(len(j.prompt_token_ids) for j in args.workload)}, "
        f"output tokens <= {sum(j.max_tokens for j in args.workload)} ({args.lengths} lengths), max batch {args.max_batch}, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )

    server = None
    url = args.redis_url
    if url is None:
        server = local_redis.start()
        url = server.url
    try:
        runs = []
        for k in range(args.repeats):
            print(f"run {k + 1}/{args.repeats}: direct ...", flush=True)
            direct = run_direct(args)
            print(f"  {direct['tokens_per_s']:.1f} tok/s; through redis ...", flush=True)
            through = run_redis(args, url)
            print(f"  {through['tokens_per_s']:.1f} tok/s", flush=True)
            runs.append((direct, through))
        # The machine may be shared: alternate the two and keep each one's median run.
        direct = sorted((d for d, _ in runs), key=lambda x: x["tokens_per_s"])[len(runs) // 2]
        through = sorted((t for _, t in runs), key=lambda x: x["tokens_per_s"])[len(runs) // 2]
    finally:
        if server is not None:
            server.stop()
    ratio = through["tokens_per_s"] / direct["tokens_per_s"]
    p99 = through["sample_to_client_ms"]["p99"]
    report = {
        "model": args.model,
        "served": args.served,  # what the engine served (benchmarks/served.py)
        "lengths": args.lengths,
        "device": args.device,
        "num_requests": len(args.workload),
        "prompt_tokens": sum(len(j.prompt_token_ids) for j in args.workload),
        "max_prompt": args.max_prompt,
        "max_output": args.max_output,
        "max_batch": args.max_batch,
        "max_batched_tokens": args.max_batched_tokens,
        "kv_blocks": args.kv_blocks,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "direct": direct,
        "redis": through,
        "throughput_ratio": ratio,
        "all_runs_tokens_per_s": [[d["tokens_per_s"], t["tokens_per_s"]] for d, t in runs],
        "targets": {"ratio>=0.9": ratio >= 0.9, "p99_ms<5": p99 < 5.0},
    }
    print(
        f"direct   {direct['tokens_per_s']:10.1f} tok/s  ({direct['tokens']} tokens in {direct['seconds']:.2f} s)"
    )
    print(
        f"redis    {through['tokens_per_s']:10.1f} tok/s  ({through['tokens']} tokens in {through['seconds']:.2f} s)"
    )
    print(f"ratio    {ratio:10.3f}  (target >= 0.90)")
    for name, key in (("sample->client", "sample_to_client_ms"), ("sample->EXEC", "publish_latency_ms")):
        lat = through[key]
        print(f"{name:15} p50 {lat['p50']:.2f} ms  p99 {lat['p99']:.2f} ms  max {lat['max']:.2f} ms")
    print("(target: sample->client p99 < 5 ms with all streams live)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"redis_e2e-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
