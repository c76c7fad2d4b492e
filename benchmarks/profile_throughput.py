"""Where Conveyor's time goes on a throughput workload: torch.profiler's top operators by self CPU time.

    python benchmarks/profile_throughput.py --workload decode [--num-requests 32] [--threads N] [--top 20]

Runs the workload's first requests through one LLMEngine (greedy, ignore_eos) under the profiler and
prints the table; writes it to benchmarks/results/profile-<workload>.txt.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.workload import WORKLOADS, bench_engine, bench_model_dir  # noqa: E402
from engine import SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="decode")
    p.add_argument("--num-requests", type=int, default=32)
    p.add_argument("--threads", type=int, default=torch.get_num_threads())
    p.add_argument("--top", type=int, default=20)
    p.add_argument("--model-cache", type=Path, default=Path.home() / ".cache" / "conveyor")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    w = WORKLOADS[a.workload]
    a.max_batch, a.max_batched_tokens, a.kv_blocks = w.max_batch, 2048, 4096
    jobs = w.jobs()[: a.num_requests]
    engine = bench_engine(bench_model_dir(a.model_cache), a, dtype="float32", device="cpu")
    warm = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    engine.generate([jobs[0].prompt_token_ids], warm)
    for i, job in enumerate(jobs):
        engine.add_request(
            f"r{i}",
            job.prompt_token_ids,
            SamplingParams(max_tokens=job.max_tokens, temperature=0, ignore_eos=True),
        )
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        while engine.has_unfinished_requests():
            engine.step()
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=a.top)
    # The same by input shape: which matmul shapes the time goes to.
    shapes = prof.key_averages(group_by_input_shape=True).table(
        sort_by="self_cpu_time_total", row_limit=a.top
    )
    table = f"{table}\nBy input shape:\n{shapes}"
    print(table)
    out = RESULTS / f"profile-{a.workload}.txt"
    out.write_text(f"{a.num_requests} requests of {a.workload}, {a.threads} torch threads\n{table}\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
