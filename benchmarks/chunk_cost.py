"""The CPU of one streamed token's chunk (worker/gateway/chunks.py, ChunkWriter.token), side by side in one
run: for each route, a token without logprobs, one with finite logprobs (written by orjson) and one whose
logprobs hold a -inf (written by Python's json, as the finite ones were before session 18).

    python benchmarks/chunk_cost.py [--top 0] [--rounds 5] [--number 20000]

`--top`: alternatives listed per token (the request's top_logprobs). Printed: µs per chunk, the median
of the rounds, and the ratio of the finite case to the -inf one (what orjson saves per token).
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import timeit
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from worker.batch.openai_input import CHAT_URL, COMPLETIONS_URL  # noqa: E402
from worker.gateway.chunks import ChunkWriter  # noqa: E402


def event(top: int, last: float | None) -> dict:
    """A token event as the worker writes it: `last` None for no logprobs, else the last listed one's."""
    out = {"type": "token", "index": 5, "token_ids": [123], "text": " hello"}
    if last is not None:
        listed = [[123, -0.53125]] + [[200 + k, -1.5 - k] for k in range(top)]
        listed[-1][1] = last
        out["logprobs"] = [listed]
        out["logprob_tokens"] = [[" hello"] + [f" alt{k}" for k in range(top)]]
    return out


def main(args: argparse.Namespace) -> None:
    cases = {"no logprobs": None, "finite logprobs": -0.25, "a -inf logprob": float("-inf")}
    for url in (COMPLETIONS_URL, CHAT_URL):
        writer = ChunkWriter(url, "job-1", "bench", 1, True, 60.0)
        costs = {}
        for name, last in cases.items():
            chunk = functools.partial(writer.token, event(args.top, last))
            rounds = [timeit.timeit(chunk, number=args.number) for _ in range(args.rounds)]
            costs[name] = statistics.median(rounds) / args.number * 1e6
        line = "  ".join(f"{name} {cost:.2f} µs" for name, cost in costs.items())
        ratio = costs["finite logprobs"] / costs["a -inf logprob"]
        print(f"{url:22} {line}  finite / -inf {ratio:.2f}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--top", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--number", type=int, default=20000)
    main(parser.parse_args())
