"""What prefix affinity can buy a worker's engine alone (issue 22), no Redis: one worker's share of
benchmarks/affinity.py's prefix run (96 jobs: 12 prefixes x 8 with affinity, 96 of the 36 prefixes' jobs
spread at random without), through one LLMEngine with the benchmark's KV pool, in one run.

    python benchmarks/affinity_engine_only.py                  # max_num_seqs 64 (the default) and 8

The ratio of the two CPU times bounds what routing can do for the tiny model at that batch limit: the
workers' own host work and Redis only add time that affinity does not remove.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.affinity import text_of  # noqa: E402

PREFIX_TOKENS, JOBS_PER_PREFIX, PREFIXES, POOL_BLOCKS = 512, 8, 36, 15 * 32


def one(model: str, tokenizer, max_num_seqs: int, grouped: bool, prefixes: int) -> dict:
    from engine.llm_engine import LLMEngine
    from engine.sampling_params import SamplingParams

    engine = LLMEngine(
        model, num_kv_blocks=POOL_BLOCKS, block_size=16, max_num_seqs=max_num_seqs, dtype="float32"
    )
    texts = [
        text_of(tokenizer, p, PREFIX_TOKENS, f"Document {p} of the harbour archive. ")
        for p in range(PREFIXES)
    ]
    rng = random.Random(7)
    if grouped:  # the jobs of its own prefixes, as a worker with affinity gets them
        jobs = [(p, j) for p in range(prefixes) for j in range(JOBS_PER_PREFIX)]
        rng.shuffle(jobs)
    else:  # as many jobs, of every prefix
        jobs = [(p, j) for p in range(PREFIXES) for j in range(JOBS_PER_PREFIX)]
        rng.shuffle(jobs)
        jobs = jobs[: prefixes * JOBS_PER_PREFIX]
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    wall, cpu, steps = time.perf_counter(), time.process_time(), 0
    for k, (p, j) in enumerate(jobs):
        engine.add_request(f"r{k}", texts[p] + f"\nQuestion {j}: what does line {j * 7 + p} say?", params)
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    stats = engine.stats()
    return {
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
        "steps": steps,
        "computed": stats.prefix_cache_queries - stats.prefix_cache_hits,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--max-num-seqs", type=int, nargs="+", default=[64, 8])
    parser.add_argument("--prefixes", type=int, default=12, help="the worker's share of the 36")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    from transformers import AutoTokenizer

    from worker.cli.tiny_model import resolve_model

    torch.set_num_threads(1)  # as the benchmark's workers (--torch-threads 1)
    model = resolve_model("tiny")
    tokenizer = AutoTokenizer.from_pretrained(model)
    for seqs in args.max_num_seqs:
        spread = one(model, tokenizer, seqs, False, args.prefixes)
        grouped = one(model, tokenizer, seqs, True, args.prefixes)
        print(
            f"max_num_seqs {seqs:3d}: without (spread) {spread['cpu_s']:.2f} s CPU, {spread['steps']} steps, "
            f"{spread['computed']} computed; with (grouped) {grouped['cpu_s']:.2f} s, {grouped['steps']} steps, "
            f"{grouped['computed']} computed; ratio {spread['cpu_s'] / grouped['cpu_s']:.2f}x"
        )


if __name__ == "__main__":
    main()
