"""Throughput of the generic path (transformers' own Llama modules on Conveyor's paged attention) against the
native Llama code, on the engine benchmark's model, side by side in one run.

    python benchmarks/generic_vs_native.py                  # 64 requests, both paths in lockstep
    python benchmarks/generic_vs_native.py --moe            # also: a Mixtral of the same width, time in experts
    python benchmarks/generic_vs_native.py --quick --out /tmp/g.json  # tiny models, 4 requests: checks it runs

Both paths load the same checkpoint and serve the same seeded workload (greedy, ignore_eos) through LLMEngine
with the same limits; the only difference is `model_impl`. They run in lockstep, one step of each in turn
(see `lockstep`), which keeps a shared, noisy machine's load out of the ratio. Their tokens must agree.
Then a few full-batch decode steps of each run under the torch profiler, and the op table says where the
generic path spends what the native one does not. With --moe, forward hooks on the experts modules measure
their share of the forward (transformers 5.24's experts run as one grouped matmul per projection, no loop
over tokens). Writes benchmarks/results/generic_vs_native.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.served import resolve  # noqa: E402
from benchmarks.workload import Job, bench_engine, bench_model_dir, make_workload  # noqa: E402
from engine import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
IMPLS = ("native", "transformers")


def _params(job: Job) -> SamplingParams:
    return SamplingParams(max_tokens=job.max_tokens, temperature=0, ignore_eos=True)


def lockstep(model_dir: Path, jobs: list[Job], args: argparse.Namespace) -> dict:
    """Both engines get the same requests and step alternately, each step timed: their schedules are
    identical (same requests, same limits), so every pair of steps does the same work, and a noisy machine's
    load drifts over both alike. Throughput = output tokens / the engine's summed step time."""
    engines = {
        impl: bench_engine(model_dir, args, dtype=args.dtype, device="cpu", model_impl=impl) for impl in IMPLS
    }
    for engine in engines.values():  # untimed warm-up: first-call costs out of the figure
        for i, job in enumerate(jobs[: args.warmup]):
            engine.add_request(f"w{i}", job.prompt_token_ids, SamplingParams(max_tokens=4, ignore_eos=True))
        while engine.has_unfinished_requests():
            engine.step()
    tokens = {impl: {f"r{i}": [] for i in range(len(jobs))} for impl in IMPLS}
    seconds = dict.fromkeys(IMPLS, 0.0)
    forward = dict.fromkeys(IMPLS, 0.0)
    for engine in engines.values():
        for i, job in enumerate(jobs):
            engine.add_request(f"r{i}", job.prompt_token_ids, _params(job))
    step = 0
    while any(e.has_unfinished_requests() for e in engines.values()):
        order = IMPLS if step % 2 == 0 else IMPLS[::-1]  # neither always goes first
        for impl in order:
            engine = engines[impl]
            t0 = time.perf_counter()
            deltas = engine.step()
            seconds[impl] += time.perf_counter() - t0
            forward[impl] += engine.runner.last_forward_seconds
            for d in deltas:
                tokens[impl][d.request_id].extend(d.new_token_ids)
        step += 1
    out = {}
    for impl in IMPLS:
        produced = sum(len(t) for t in tokens[impl].values())
        out[impl] = {
            "model": type(engines[impl].model).__name__,
            "steps": step,
            "output_tokens": produced,
            "step_seconds": round(seconds[impl], 3),
            "tokens_per_s": round(produced / seconds[impl], 1),
            "forward_share": round(forward[impl] / seconds[impl], 3),
        }
    out["same_tokens"] = tokens["native"] == tokens["transformers"]
    return out


def profile_decode(model_dir: Path, jobs: list[Job], args: argparse.Namespace, impl: str) -> list[dict]:
    """Op table of a few decode steps at full batch: self CPU time per op, top rows."""
    engine = bench_engine(model_dir, args, dtype=args.dtype, device="cpu", model_impl=impl)
    for i, job in enumerate(jobs[: args.max_batch]):
        engine.add_request(f"p{i}", job.prompt_token_ids[:64], SamplingParams(max_tokens=64, ignore_eos=True))
    while engine.stats().num_waiting:
        engine.step()
    engine.step()  # the last prefill chunks: the profiled steps are pure decode
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        for _ in range(args.profile_steps):
            engine.step()
    table = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in table)
    rows = sorted(table, key=lambda e: e.self_cpu_time_total, reverse=True)[:12]
    return [
        {
            "op": e.key,
            "calls_per_step": e.count // args.profile_steps,
            "ms_per_step": round(e.self_cpu_time_total / 1000 / args.profile_steps, 2),
            "share": round(e.self_cpu_time_total / total, 3),
        }
        for e in rows
    ]


def moe_share(model_dir: Path, jobs: list[Job], args: argparse.Namespace) -> dict:
    """A Mixtral as wide as the benchmark model (8 experts, top 2): throughput and the experts' forward share."""
    engine = bench_engine(model_dir, args, dtype=args.dtype, device="cpu")
    spent = [0.0]
    starts: dict[int, float] = {}
    for module in engine.model.hf.modules():
        if type(module).__name__.endswith("Experts"):
            module.register_forward_pre_hook(lambda m, a: starts.__setitem__(id(m), time.perf_counter()))
            module.register_forward_hook(
                lambda m, a, o: spent.__setitem__(0, spent[0] + time.perf_counter() - starts[id(m)])
            )
    for i, job in enumerate(jobs):
        engine.add_request(f"m{i}", job.prompt_token_ids, _params(job))
    forward, produced = 0.0, 0
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        produced += sum(len(d.new_token_ids) for d in engine.step())
        forward += engine.runner.last_forward_seconds
    elapsed = time.perf_counter() - start
    experts_impl = getattr(engine.model.hf.config, "_experts_implementation", None)
    return {
        "experts_implementation": experts_impl,
        "tokens_per_s": round(produced / elapsed, 1),
        "experts_share_of_forward": round(spent[0] / forward, 3),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--num-requests", type=int, default=64)
    ap.add_argument("--max-prompt", type=int, default=256)
    ap.add_argument("--max-output", type=int, default=128)
    ap.add_argument("--max-batch", type=int, default=32)
    ap.add_argument("--max-batched-tokens", type=int, default=2048)
    ap.add_argument("--kv-blocks", type=int, default=4096)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=1, help="lockstep runs")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--profile-steps", type=int, default=5)
    ap.add_argument("--moe", action="store_true")
    ap.add_argument(
        "--cache", type=Path, default=Path(os.environ.get("CONVEYOR_BENCH_CACHE", "/tmp/conveyor-bench"))
    )
    ap.add_argument("--out", type=Path, default=RESULTS / "generic_vs_native.json")
    ap.add_argument(
        "--quick", action="store_true",
        help="the tiny models (tiny, tiny:mixtral), 4 requests of <= 32 + 8 tokens, one warm-up and profiled step",
    )  # fmt: skip
    args = ap.parse_args()

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.num_requests, args.max_prompt, args.max_output, args.max_batch = 4, 32, 8, 4
        args.warmup, args.profile_steps, args.kv_blocks = 1, 1, 64
        model_dir, moe_dir = Path(resolve("tiny")), Path(resolve("tiny:mixtral"))
    else:
        model_dir = bench_model_dir(args.cache)
        moe_dir = bench_model_dir(args.cache, arch="mixtral", num_kv_heads=8, intermediate_size=704)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    jobs = make_workload(
        args.num_requests,
        min_prompt=min(16, args.max_prompt),
        max_prompt=args.max_prompt,
        max_output=args.max_output,
        vocab_size=vocab,
        seed=3,
    )
    runs = [lockstep(model_dir, jobs, args) for _ in range(args.repeats)]
    for run in runs:
        print(json.dumps(run), flush=True)
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "args": {k: str(v) for k, v in vars(args).items()},
        "runs": runs,
        "same_tokens": all(r["same_tokens"] for r in runs),
        "generic_over_native": [
            round(r["transformers"]["tokens_per_s"] / r["native"]["tokens_per_s"], 3) for r in runs
        ],
        "decode_profile": {impl: profile_decode(model_dir, jobs, args, impl) for impl in IMPLS},
    }
    if args.moe:
        report["moe"] = moe_share(moe_dir, jobs, args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(json.dumps({k: v for k, v in report.items() if k not in ("args", "decode_profile")}, indent=2))
    for impl, rows in report["decode_profile"].items():
        print(f"\n{impl}: top ops in {args.profile_steps} decode steps at batch {args.max_batch}")
        for row in rows:
            print(
                f"  {row['op']:<40} {row['calls_per_step']:>6} calls {row['ms_per_step']:>8} ms  {row['share']:.1%}"
            )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
