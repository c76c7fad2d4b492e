"""Output tokens/s of Conveyor against transformers, side by side in one run, and model FLOP utilisation.

    python benchmarks/throughput.py --workload chat     # 256 requests, prompts 16-512, batch 64 (~6 min)
    python benchmarks/throughput.py --workload decode   # 64 requests, prompts 16-256, outputs ~70, batch 32
    python benchmarks/throughput.py --quick             # a few minutes: 64 requests, shorter prompts
    python benchmarks/throughput.py --model smollm2-135m-instruct --lengths eos --systems conveyor_continuous

`--model bench` (the default) is a ~50M random-weight model fed random token prompts. Any other model (a
short name, a .gguf file, a folder, tiny) gets chat prompts: a seeded choice of questions rendered with its
chat template (benchmarks/chat_workload.py), answers ending at EOS capped at --max-output (`--lengths eos`,
the default there: real lengths) or exactly --max-output tokens each (`--lengths fixed`). transformers'
systems run with fixed lengths only (they are timed as making every requested token).

The systems are Conveyor continuous and transformers' continuous batching unless `--systems` names others
(`conveyor_static`, `hf_generate_static`: the latter takes ~19 minutes on the chat workload). Every system
runs the same seeded workload at the same maximum batch and dtype, greedy with ignore_eos, so each request
produces exactly its requested number of tokens. MFU (benchmarks/mfu.py): the matmul FLOPs Conveyor's steps
computed, over each system's time, against the GEMM rate of the same shapes timed after the runs, three
ways: `mfu` against one [K, N] weight per shape kept in cache (warm), `mfu_streamed` against [K, N] weights
read from DRAM as the model reads them, `mfu_streamed_nk` the same in the model's own [N, K] layout. Writes
JSON (default benchmarks/results/throughput-<workload>-<time>.json) and a PNG chart beside it.
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

from benchmarks.chat_workload import LENGTHS, chat_jobs  # noqa: E402
from benchmarks.mfu import StepRecorder, mfu_report, utilisation  # noqa: E402
from benchmarks.proc_counters import cpu_name  # noqa: E402
from benchmarks.served import add_model_options, resolve, served  # noqa: E402
from benchmarks.workload import WORKLOADS, Job, bench_engine, bench_model_dir, make_workload  # noqa: E402
from engine import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def run_conveyor(model_dir: Path, jobs: list[Job], args: argparse.Namespace, scheduling: str) -> dict:
    engine = bench_engine(model_dir, args, dtype=args.dtype, device="cpu", scheduling=scheduling)
    args.served = served(engine)
    recorder = StepRecorder.attach(engine)
    for i, job in enumerate(jobs):
        engine.add_request(f"r{i}", job.prompt_token_ids, _params(job))
    produced = 0
    step_seconds = forward_seconds = 0.0
    peak_waste = (0, 0)  # (unwritten slots, allocated slots) at the step with most blocks allocated
    decode_batch_steps = [0.0, 0.0]  # time outside the forward, total time: steps with >= 64 decodes
    start, cpu_start = time.perf_counter(), time.process_time()
    while engine.has_unfinished_requests():
        t0 = time.perf_counter()
        deltas = engine.step()
        dt = time.perf_counter() - t0
        fwd = engine.runner.last_forward_seconds
        step_seconds += dt
        forward_seconds += fwd
        produced += sum(len(d.new_token_ids) for d in deltas)
        waste = engine.kv_waste()
        if waste[1] > peak_waste[1]:
            peak_waste = waste
        if engine.stats().num_running >= min(64, args.max_batch):
            decode_batch_steps[0] += dt - fwd
            decode_batch_steps[1] += dt
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    stats = engine.stats()
    return {
        "output_tokens": produced,
        "seconds": elapsed,
        "tokens_per_s": produced / elapsed,
        "forward_seconds": forward_seconds,
        "cpu_seconds": cpu,  # all of this process's threads: less sensitive than `seconds` to a busy machine
        "recorder": recorder,  # popped by main() before the JSON is written
        "kv_waste_at_peak": peak_waste[0] / max(1, peak_waste[1]),
        "outside_forward_share": (step_seconds - forward_seconds) / max(step_seconds, 1e-9),
        "outside_forward_share_full_batch": decode_batch_steps[0] / max(decode_batch_steps[1], 1e-9),
        "preemptions": stats.num_preemptions,
        "prefix_cache_hit_rate": stats.prefix_cache_hits / max(1, stats.prefix_cache_queries),
    }


def _params(job: Job) -> SamplingParams:
    return SamplingParams(max_tokens=job.max_tokens, temperature=0, ignore_eos=job.ignore_eos)


def _hf_model(model_dir: Path, dtype: str):
    from transformers import AutoModelForCausalLM

    model_dir = Path(model_dir)
    # A GGUF file: transformers reads (and dequantizes) it from its folder.
    where = {"gguf_file": model_dir.name} if model_dir.suffix == ".gguf" else {}
    model = AutoModelForCausalLM.from_pretrained(
        model_dir.parent if where else model_dir,
        dtype=getattr(torch, dtype),
        attn_implementation="sdpa",
        **where,
    )
    return model.eval()


def run_hf_static(model_dir: Path, jobs: list[Job], args: argparse.Namespace) -> dict:
    """transformers' `generate` over left-padded batches of max_batch; a batch runs to its longest output.
    Only the tokens each request asked for are counted as output."""
    model = _hf_model(model_dir, args.dtype)
    produced = 0
    start = time.perf_counter()
    for b in range(0, len(jobs), args.max_batch):
        batch = jobs[b : b + args.max_batch]
        width = max(len(j.prompt_token_ids) for j in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, job in enumerate(batch):
            n = len(job.prompt_token_ids)
            ids[row, width - n :] = torch.tensor(job.prompt_token_ids)
            mask[row, width - n :] = 1
        new = max(j.max_tokens for j in batch)
        with torch.no_grad():
            model.generate(
                ids,
                attention_mask=mask,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                pad_token_id=0,
            )
        produced += sum(j.max_tokens for j in batch)
    elapsed = time.perf_counter() - start
    return {"output_tokens": produced, "seconds": elapsed, "tokens_per_s": produced / elapsed}


def run_hf_continuous(model_dir: Path, jobs: list[Job], args: argparse.Namespace) -> dict:
    """transformers' own continuous batching (ContinuousBatchingManager, sdpa), with its cache sized
    explicitly: left to itself it sizes the cache from all system memory."""
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    model = _hf_model(model_dir, args.dtype)
    cb = ContinuousBatchingConfig(
        page_size=256,
        num_blocks=max(8, args.kv_blocks * 16 // 256),
        max_batch_tokens=args.max_batched_tokens,
        max_requests_per_batch=args.max_batch,
        allow_block_sharing=False,
        use_cuda_graph=False,
    )
    gen = GenerationConfig(do_sample=False, max_new_tokens=max(j.max_tokens for j in jobs), eos_token_id=-1)
    produced = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    with model.continuous_batching_context_manager(
        generation_config=gen, continuous_batching_config=cb
    ) as mgr:
        for i, job in enumerate(jobs):
            mgr.add_request(
                job.prompt_token_ids, request_id=f"r{i}", max_new_tokens=job.max_tokens, eos_token_id=-1
            )
        for _ in jobs:
            result = mgr.get_result(timeout=600)
            if result is None:
                raise RuntimeError("transformers' continuous batching returned no result within 600 s")
            produced += len(result.generated_tokens)
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu_start
    return {
        "output_tokens": produced,
        "seconds": elapsed,
        "tokens_per_s": produced / elapsed,
        "cpu_seconds": cpu,
    }


SYSTEMS = {
    "conveyor_continuous": lambda m, j, a: run_conveyor(m, j, a, "continuous"),
    "conveyor_static": lambda m, j, a: run_conveyor(m, j, a, "static"),
    "hf_generate_static": run_hf_static,
    "hf_continuous_batching": run_hf_continuous,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--workload",
        choices=sorted(WORKLOADS),
        default="chat",
        help="sets the four options below unless they are given",
    )
    parser.add_argument("--num-requests", type=int)
    parser.add_argument("--max-prompt", type=int)
    parser.add_argument("--max-output", type=int)
    parser.add_argument("--max-batch", type=int)
    parser.add_argument("--max-batched-tokens", type=int, default=2048)
    parser.add_argument("--kv-blocks", type=int, default=4096, help="KV pool in blocks of 16 tokens")
    parser.add_argument(
        "--systems",
        default="conveyor_continuous,hf_continuous_batching",
        help="comma-separated subset of " + ",".join(SYSTEMS),
    )
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="float32",
        help="weights and activations, the same for every system (bfloat16 uses the CPU's bf16 matmul units)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=torch.get_num_threads(),
        help="torch threads for every system (on a shared machine, fewer threads than cores measure steadier)",
    )
    parser.add_argument(
        "--repeats", type=int, default=1, help="run every system this many times; report the median run"
    )
    parser.add_argument(
        "--warmup",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="an untimed 16-request run of every system first (default on)",
    )
    parser.add_argument("--quick", action="store_true", help="64 requests, prompts <= 128, outputs <= 128")
    parser.add_argument(
        "--mfu",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the runs, time the run's GEMM shapes alone for MFU (default on)",
    )
    parser.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "conveyor")
    add_model_options(parser, default="bench")
    parser.add_argument(
        "--lengths",
        choices=LENGTHS,
        help="chat prompts: answers end at EOS capped at --max-output (eos, the default), or are exactly "
        "--max-output tokens (fixed)",
    )
    parser.add_argument(
        "--shared-prefix-variant",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="after the runs, Conveyor on 64 requests sharing a prompt prefix (prefix-cache hit rate)",
    )
    parser.add_argument(
        "--out",
        type=Path,
        help="JSON results (default: results/throughput-<workload>-<time>.json); the PNG chart goes beside it",
    )
    args = parser.parse_args()
    workload = WORKLOADS[args.workload]
    if args.quick:  # sets what is not given
        for name, value in (("num_requests", 64), ("max_prompt", 128), ("max_output", 128)):
            if getattr(args, name) is None:
                setattr(args, name, value)
    for name in ("num_requests", "max_prompt", "max_output", "max_batch"):
        if getattr(args, name) is None:
            setattr(args, name, getattr(workload, name))
    if args.out is None:
        args.out = RESULTS / f"throughput-{args.workload}-{time.strftime('%Y%m%d-%H%M%S')}.json"
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    systems = args.systems.split(",")
    if unknown := sorted(set(systems) - set(SYSTEMS)):
        parser.error(f"unknown systems {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    chat = args.model != "bench"
    if not chat and args.lengths is not None:
        parser.error("--lengths applies to chat prompts: give a real model with --model")
    args.lengths = args.lengths or ("eos" if chat else "fixed")
    if args.lengths == "eos" and any(s.startswith("hf_") for s in systems):
        parser.error("transformers' systems are timed with fixed lengths: add --lengths fixed")
    if chat:
        from engine.tokenizer import load_tokenizer

        model_dir = Path(resolve(args.model))
        tokenizer = load_tokenizer(model_dir)
        jobs = chat_jobs(tokenizer, args.num_requests, args.max_output, args.lengths)
        warm = chat_jobs(tokenizer, 16, 16, "fixed", seed=2)
    else:
        model_dir = bench_model_dir(args.model_cache)
        jobs = make_workload(
            args.num_requests,
            max_prompt=args.max_prompt,
            max_output=args.max_output,
            output_median=workload.output_median,
        )
        warm = make_workload(16, max_prompt=args.max_prompt, max_output=16, seed=2)
    print(
        f"workload: {len(jobs)} requests, prompt tokens {sum(len(j.prompt_token_ids) for j in jobs)}, "
        f"output tokens <= {sum(j.max_tokens for j in jobs)} ({args.lengths} lengths), max batch {args.max_batch}, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    if args.warmup:
        # Untimed: the first run of each shape pays one-off costs (oneDNN builds a bf16 kernel per matmul
        # shape, allocator pools grow), which would otherwise fall on whichever system runs first.
        for name in systems:
            print(f"warming up {name} ...", flush=True)
            SYSTEMS[name](model_dir, warm, args)
    runs: dict[str, list[dict]] = {name: [] for name in systems}
    for rep in range(args.repeats):
        # Alternate the order between repeats so no system always runs in the same slot.
        for name in systems if rep % 2 == 0 else systems[::-1]:
            print(f"running {name} ...", flush=True)
            runs[name].append(SYSTEMS[name](model_dir, jobs, args))
            print(
                f"  {name}: {runs[name][-1]['tokens_per_s']:.1f} output tok/s in {runs[name][-1]['seconds']:.1f} s",
                flush=True,
            )
    results: dict[str, dict] = {}
    for name, rs in runs.items():
        rs = sorted(rs, key=lambda r: r["tokens_per_s"])
        results[name] = {**rs[(len(rs) - 1) // 2], "all_tokens_per_s": [r["tokens_per_s"] for r in rs]}
    flop_report = _add_mfu(results, args) if args.mfu else {}
    for r in results.values():
        r.pop("recorder", None)

    # Chat prompts share their template's system prompt already: the main run's hit rate says it.
    if "conveyor_continuous" in results and args.shared_prefix_variant and not chat:
        prefix_jobs = make_workload(
            min(64, args.num_requests),
            max_prompt=args.max_prompt,
            max_output=32,
            shared_prefix=min(256, args.max_prompt // 2),
            seed=1,
        )
        results["shared_prefix_variant"] = run_conveyor(model_dir, prefix_jobs, args, "continuous")
        results["shared_prefix_variant"].pop("recorder")
    report = _report(results, args, jobs)
    report["flops"] = flop_report
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    _chart(results, args.out.with_suffix(".png"), args.dtype)
    print(json.dumps({"ratios": report["ratios"], "flops": flop_report}, indent=2))
    print(f"wrote {args.out} and {args.out.with_suffix('.png')}")


def _add_mfu(results: dict[str, dict], args: argparse.Namespace) -> dict:
    """Times the GEMMs of Conveyor's recorded steps (continuous, else static) and adds achieved GFLOP/s and
    MFU to every system's result: each did the same work, the FLOPs Conveyor's steps computed."""
    recorders = {n: r.pop("recorder") for n, r in results.items() if "recorder" in r}
    source = next((n for n in ("conveyor_continuous", "conveyor_static") if n in recorders), None)
    if source is None:
        return {}
    print("timing the run's GEMM shapes alone ...", flush=True)
    report = {"counted_from": source, **mfu_report(recorders[source], getattr(torch, args.dtype))}
    for r in results.values():
        r.update(utilisation(report, r["seconds"], r.get("cpu_seconds")))
        if "forward_seconds" in r:
            fwd = utilisation(report, r["forward_seconds"])
            r.update({f"forward_{k}": v for k, v in fwd.items() if k.startswith("mfu")})
    return report


def _report(results: dict[str, dict], args: argparse.Namespace, jobs: list[Job]) -> dict:
    base = results.get("conveyor_continuous", {}).get("tokens_per_s")
    ratios = {}
    if base:
        for other in ("conveyor_static", "hf_generate_static", "hf_continuous_batching"):
            if other in results:
                ratios[f"continuous_vs_{other}"] = round(base / results[other]["tokens_per_s"], 2)
        c = results["conveyor_continuous"]
        ratios["kv_waste_at_peak"] = round(c["kv_waste_at_peak"], 4)
        ratios["outside_forward_share_at_full_batch"] = round(c["outside_forward_share_full_batch"], 4)
        if "mfu" in c:
            ratios["conveyor_continuous_mfu"] = round(c["mfu"], 3)
            ratios["conveyor_continuous_mfu_cpu_time"] = round(c["mfu_cpu_time"], 3)
            # Against the same GEMMs with their weights read from DRAM, as the model does ([K, N] weights,
            # and _nk: nn.Linear's [N, K] layout, as the model holds them). benchmarks/mfu.py explains.
            for b in ("streamed", "streamed_nk"):
                ratios[f"conveyor_continuous_mfu_{b}"] = round(c[f"mfu_{b}"], 3)
                ratios[f"conveyor_continuous_mfu_{b}_cpu_time"] = round(c[f"mfu_{b}_cpu_time"], 3)
        hf = results.get("hf_continuous_batching", {}).get("cpu_seconds")
        if hf:
            ratios["continuous_vs_hf_continuous_batching_cpu_time"] = round(hf / c["cpu_seconds"], 2)
        if "shared_prefix_variant" in results:
            ratios["prefix_cache_hit_rate_shared_prefix"] = round(
                results["shared_prefix_variant"]["prefix_cache_hit_rate"], 4
            )
    return {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "cpu": cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "args": {k: str(v) for k, v in vars(args).items() if k != "served"},
        "served": getattr(args, "served", None),  # what Conveyor's engine served (benchmarks/served.py)
        "num_requests": len(jobs),
        "prompt_tokens": sum(len(j.prompt_token_ids) for j in jobs),
        "results": results,
        "ratios": ratios,
    }


def _chart(results: dict[str, dict], path: Path, dtype: str) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no chart")
        return
    names = [n for n in SYSTEMS if n in results]
    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.bar(
        names,
        [results[n]["tokens_per_s"] for n in names],
        color=["#2a7", "#7a2", "#888", "#aaa"][: len(names)],
    )
    ax.set_ylabel("output tokens/s")
    ax.set_title(f"Same workload, same max batch (CPU, {dtype})")
    plt.setp(ax.get_xticklabels(), rotation=15, ha="right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
