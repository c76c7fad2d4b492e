"""The batching and paging articles' claims, measured on one model, with charts (docs/operations.md, "Tuning").

    CONVEYOR_CACHE=/work/dl python benchmarks/article.py        # SmolLM2-135M-Instruct: ~8 min on 2 busy CPU cores
    python benchmarks/article.py --quick --model tiny           # every experiment at toy sizes, seconds

Chat prompts (benchmarks/chat_workload.py) rendered with the model's template; greedy answers that end at
the model's EOS, capped at the sizes' `max_output`; prefix caching off, so that blocks are never shared
and every request's KV is its own. Requests arrive as a Poisson process and the clock is simulated from
measured step times (benchmarks/arrival_replay.py). Experiments, all on one engine implementation:

- static vs continuous (`scheduling`): throughput, time to first token and end-to-end latency (p50, p99)
  at several arrival rates, the last one a burst of every request at once (saturation);
- contiguous vs paged (`kv_allocation` reserve_max vs paged) under one fixed KV budget (a number of
  max_model_len reservations): KV waste (held but unwritten / held), the most sequences running at once,
  and throughput, every request arriving at once;
- the knobs: `max_num_seqs` (throughput against latency and its spread, at saturation), max_wait_ms (the
  worker's `--max-wait-ms`: a lone user's latency against throughput at a moderate rate), `block_size`
  (step time against KV waste, at saturation).

Writes article-<tag>.json and one PNG per experiment beside it (default benchmarks/results/article/).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.arrival_replay import poisson_times, replay  # noqa: E402
from benchmarks.article_charts import describe, draw_all  # noqa: E402
from benchmarks.chat_workload import chat_jobs  # noqa: E402
from benchmarks.proc_counters import cpu_name  # noqa: E402
from benchmarks.served import resolve, served  # noqa: E402
from benchmarks.workload import Job  # noqa: E402
from engine import LLMEngine, SamplingParams  # noqa: E402
from kernels.block_sizes import TRITON_BLOCK_SIZES  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "article"


@dataclass(frozen=True)
class Sizes:
    num_requests: int  # per run of the batching and knob experiments
    max_output: int  # cap on each answer (most end earlier, at EOS)
    max_model_len: int  # what reserve_max reserves per request
    max_num_seqs: int  # the batch every experiment but the max_num_seqs sweep uses
    block_size: int  # likewise
    rates: tuple[float, ...]  # arrivals per second; inf: all at once
    seqs_sweep: tuple[int, ...]
    wait_sweep_ms: tuple[int, ...]
    wait_rate: float  # the load the max_wait_ms sweep runs under
    lone_requests: int  # requests of the lone user, each arriving on an idle engine
    block_sweep: tuple[int, ...]
    budget_reservations: int  # the fixed KV budget: this many max_model_len reservations
    budget_requests: int  # all arriving at once, more than the budget holds contiguously


FULL = Sizes(
    num_requests=10,
    max_output=64,
    max_model_len=512,
    max_num_seqs=4,
    block_size=16,
    rates=(0.25, 1.0, math.inf),
    seqs_sweep=(2, 4, 10),
    wait_sweep_ms=(0, 200, 1000),
    wait_rate=0.25,
    lone_requests=1,
    block_sweep=(8, 16, 64),
    budget_reservations=3,
    budget_requests=16,
)
QUICK = Sizes(
    num_requests=6,
    max_output=12,
    max_model_len=128,
    max_num_seqs=4,
    block_size=16,
    rates=(4.0, math.inf),
    seqs_sweep=(2, 4),
    wait_sweep_ms=(0, 50),
    wait_rate=4.0,
    lone_requests=1,
    block_sweep=(16, 32),
    budget_reservations=2,
    budget_requests=8,
)


class Bench:
    """Builds engines (the last two alive, so two configurations can alternate) and runs workloads on them,
    each distinct run once."""

    def __init__(self, model: str, sizes: Sizes, jobs: list[Job], args: argparse.Namespace) -> None:
        self.model, self.sizes, self.jobs, self.args = model, sizes, jobs, args
        self._engines: dict[tuple, LLMEngine] = {}
        self._runs: dict[tuple, dict] = {}
        self.served: dict | None = None

    def engine_options(self, **overrides) -> dict:
        s = self.sizes
        opts = dict(
            device=self.args.device,
            max_model_len=s.max_model_len,
            max_num_seqs=s.max_num_seqs,
            block_size=s.block_size,
            enable_prefix_caching=False,
            scheduling="continuous",
            kv_allocation="paged",
        )
        opts.update(overrides)
        if "num_kv_blocks" not in opts:  # room for every sequence at full length: no preemption
            opts["num_kv_blocks"] = opts["max_num_seqs"] * -(-s.max_model_len // opts["block_size"])
        return opts

    def run(self, jobs: list[Job], times: list[float], max_wait_ms: int = 0, **engine) -> dict:
        opts = self.engine_options(**engine)
        key = (tuple(sorted(opts.items())), tuple(times), len(jobs), max_wait_ms)
        if key not in self._runs:
            eng = self._engine_for(opts)
            print(f"  run {_label(engine)} requests={len(jobs)} wait={max_wait_ms}ms ...", flush=True)
            self._runs[key] = replay(eng, jobs, times, max_wait_ms / 1000)
            r = self._runs[key]
            print(
                f"    {r['tokens_per_s']:.1f} tok/s, ttft p50 {r['ttft_p50_s']:.2f}s, e2e p99 {r['e2e_p99_s']:.2f}s",
                flush=True,
            )
        return self._runs[key]

    def _engine_for(self, opts: dict) -> LLMEngine:
        key = tuple(sorted(opts.items()))
        if key not in self._engines:
            if len(self._engines) >= 2:
                self._engines.pop(next(iter(self._engines))).close()
            engine = self._engines[key] = LLMEngine(self.model, **opts)
            self.served = self.served or served(engine)
            # Untimed: the first steps of an engine pay one-off costs (allocator pools, kernel choice).
            warm = self.jobs[0]
            engine.generate([warm.prompt_token_ids], SamplingParams(max_tokens=4, temperature=0))
        return self._engines[key]

    def close(self) -> None:
        while self._engines:
            self._engines.popitem()[1].close()


def experiments(b: Bench) -> dict:
    """Every experiment, ordered so that few engines are built (two stay alive at a time)."""
    s = b.sizes
    jobs = b.jobs[: s.num_requests]
    at = {rate: poisson_times(len(jobs), rate) for rate in s.rates}
    burst = at.get(math.inf) or poisson_times(len(jobs), math.inf)
    wait_times = at.get(s.wait_rate) or poisson_times(len(jobs), s.wait_rate, seed=1)
    lone = jobs[: s.lone_requests]
    lone_times = [1000.0 * k for k in range(len(lone))]  # each arrives long after the last one finished

    # Static and continuous alternate at each rate, so that a busy machine's changing load falls on both.
    batching = []
    for rate in s.rates:
        for scheduling in ("continuous", "static"):
            row = b.run(jobs, at[rate], scheduling=scheduling)
            batching.append({"scheduling": scheduling, "rate": _rate_value(rate), **row})
    batching.sort(key=lambda r: r["scheduling"] != "continuous")  # stable: rates stay in order
    wait = []
    for ms in s.wait_sweep_ms:
        alone = b.run(lone, lone_times, ms)
        loaded = b.run(jobs, wait_times, ms)
        wait.append({"max_wait_ms": ms, "lone": alone, "loaded": loaded})

    budget_jobs = b.jobs[: s.budget_requests]
    budget_blocks = s.budget_reservations * -(-s.max_model_len // s.block_size)
    paging = []
    for mode in ("reserve_max", "paged"):
        row = b.run(
            budget_jobs,
            poisson_times(len(budget_jobs), math.inf),
            kv_allocation=mode,
            num_kv_blocks=budget_blocks,
            max_num_seqs=len(budget_jobs),  # the budget limits the batch, not max_num_seqs
        )
        paging.append({"kv_allocation": mode, "kv_budget_blocks": budget_blocks, **row})

    seqs = [{"max_num_seqs": n, **b.run(jobs, burst, max_num_seqs=n)} for n in s.seqs_sweep]
    blocks = [{"block_size": n, **b.run(jobs, burst, block_size=n)} for n in _block_sizes(s, b.args.device)]
    b.close()
    return {
        "batching": batching,
        "paging": paging,
        "max_num_seqs": seqs,
        "max_wait_ms": wait,
        "block_size": blocks,
    }


def claims(results: dict) -> dict:
    """The articles' figures next to this run's."""
    by = {(r["scheduling"], r["rate"]): r for r in results["batching"]}
    rates = [r["rate"] for r in results["batching"] if r["scheduling"] == "continuous"]
    per_rate = {
        f"{rate}_per_s" if isinstance(rate, float) else rate: {
            "throughput_ratio": by["continuous", rate]["tokens_per_s"] / by["static", rate]["tokens_per_s"],
            "ttft_p50_ratio": by["static", rate]["ttft_p50_s"]
            / max(by["continuous", rate]["ttft_p50_s"], 1e-9),
            "e2e_p99_ratio": by["static", rate]["e2e_p99_s"] / max(by["continuous", rate]["e2e_p99_s"], 1e-9),
            # Steps each needed for the same tokens: the throughput ratio were a step's cost the same at
            # any batch (close on a GPU), and unaffected by a busy machine's changing speed.
            "steps_ratio": by["static", rate]["steps"] / by["continuous", rate]["steps"],
        }
        for rate in rates
    }
    reserve, paged = (
        next(r for r in results["paging"] if r["kv_allocation"] == m) for m in ("reserve_max", "paged")
    )
    return {
        "continuous_vs_static (article: up to 20-23x throughput)": per_rate,
        "kv_waste (article: 60-80% contiguous, under 4% paged)": {
            "reserve_max_mean": reserve["kv_waste_mean"],
            "reserve_max_at_peak": reserve["kv_waste_at_peak"],
            "paged_mean": paged["kv_waste_mean"],
            "paged_at_peak": paged["kv_waste_at_peak"],
        },
        "paged_vs_reserve_max at one KV budget (article: 2-4x throughput)": {
            "most_concurrent_seqs": [reserve["most_concurrent_seqs"], paged["most_concurrent_seqs"]],
            "throughput_ratio": paged["tokens_per_s"] / reserve["tokens_per_s"],
            "steps_ratio": reserve["steps"] / paged["steps"],
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m-instruct",
        help="smollm2-135m-instruct (fetched once into CONVEYOR_CACHE), tiny, a .gguf file or a folder",
    )
    parser.add_argument("--quick", action="store_true", help="toy sizes: every experiment in seconds")
    parser.add_argument("--device", default="cpu", help="cpu, cuda or auto")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch threads")
    parser.add_argument("--out-dir", type=Path, default=RESULTS, help="JSON and PNGs go here")
    parser.add_argument("--tag", help="file name suffix (default: the model's name, plus -quick)")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    tag = args.tag or _model_tag(args.model) + ("-quick" if args.quick else "")
    torch.set_num_threads(args.threads)

    from engine.tokenizer import load_tokenizer

    model = resolve(args.model)
    most = max(sizes.num_requests, sizes.budget_requests)
    jobs = chat_jobs(load_tokenizer(model), most, sizes.max_output, "eos")
    bench = Bench(model, sizes, jobs, args)
    load_before = os.getloadavg()
    started = time.perf_counter()
    # Stepped from a second thread, as the worker steps its engine: on a busy machine torch's intra-op
    # threads driven from the main thread ran several times slower (benchmarks/RESULTS.md).
    box: dict = {}
    worker = threading.Thread(target=lambda: box.update(results=experiments(bench)))
    worker.start()
    worker.join()
    if "results" not in box:
        raise SystemExit("the experiments failed (see the traceback above)")
    results = box["results"]
    report = {
        "machine": f"{platform.machine()} {os.cpu_count()} cpus, torch {torch.__version__}",
        "cpu": cpu_name(),
        "torch_threads": torch.get_num_threads(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "wall_seconds": time.perf_counter() - started,
        "model": args.model,
        "served": bench.served,
        "sizes": {**asdict(sizes), "rates": [_rate_value(r) for r in sizes.rates]},
        "prompt_tokens": [len(j.prompt_token_ids) for j in jobs],
        "claims": claims(results),
        "results": results,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    out = args.out_dir / f"article-{tag}.json"
    out.write_text(json.dumps(report, indent=2, allow_nan=False))
    charts = draw_all(results, args.out_dir, tag, describe(report))
    print(json.dumps(report["claims"], indent=2))
    print(f"wrote {out} and {', '.join(p.name for p in charts)}")


def _block_sizes(sizes: Sizes, device: str) -> tuple[int, ...]:
    """The sweep, less the sizes the Triton kernels do not take when the engine will run on CUDA."""
    on_cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return tuple(n for n in sizes.block_sweep if not on_cuda or n in TRITON_BLOCK_SIZES)


def _label(engine: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in engine.items()) or "base"


def _rate_value(rate: float) -> float | str:
    """A rate as the JSON holds it: requests per second, or "all_at_once"."""
    return "all_at_once" if math.isinf(rate) else rate


def _model_tag(model: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(model).stem if model.endswith(".gguf") else Path(model).name)


if __name__ == "__main__":
    main()
