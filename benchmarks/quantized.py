"""Output tokens/s of one model served unquantized, int8 and int4, side by side in one run.

    python benchmarks/quantized.py --model path/to/checkpoint   # 32 requests at once, then 4 one at a time
    python benchmarks/quantized.py --quick                      # the tiny random model, a few seconds

Each configuration is `quantization:dtype` (`--configs`, default none:float32, none:bfloat16, int8:bfloat16,
int4:bfloat16): on the CPU the packed int8/int4 kernels are fast with bfloat16 activations and slow with
float32 ones, so the quantized modes are compared in bfloat16 and against both float32 and bfloat16. Every
configuration runs the same seeded prompts, greedy with ignore_eos, so each request produces exactly
`--output-len` tokens: "batch" submits `--num-prompts` requests at once (max_num_seqs = that many),
"single" runs `--single-prompts` requests one after another. tokens/s is output tokens over wall time, after
one warm-up request. Writes JSON (default benchmarks/results/quantized-<time>.json).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import LLMEngine, SamplingParams  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_CONFIGS = "none:float32,none:bfloat16,int8:bfloat16,int4:bfloat16"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint folder (or a GGUF file once the engine reads them)")
    p.add_argument("--quick", action="store_true", help="the tiny random model and small sizes")
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated quantization:dtype pairs")
    p.add_argument("--device", default="cpu")
    p.add_argument("--num-prompts", type=int, default=32, help="requests submitted at once (batch workload)")
    p.add_argument("--single-prompts", type=int, default=4, help="requests run one at a time")
    p.add_argument("--input-len", type=int, default=64)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, help="JSON path (default benchmarks/results/quantized-<time>.json)")
    args = p.parse_args(argv)
    if args.quick:
        args.num_prompts, args.single_prompts, args.input_len, args.output_len = 8, 2, 16, 8
    if not args.model and not args.quick:
        p.error("--model is required unless --quick")
    return args


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab) for _ in range(length)] for _ in range(n)]


def tokens_per_s(
    llm: LLMEngine, batch: list[list[int]], params: SamplingParams, one_at_a_time: bool
) -> float:
    start = time.perf_counter()
    groups = [[p] for p in batch] if one_at_a_time else [batch]
    produced = sum(len(o.outputs[0].token_ids) for g in groups for o in llm.generate(g, params))
    return produced / (time.perf_counter() - start)


def run_config(model: str, quantization: str, dtype: str, args: argparse.Namespace) -> dict:
    llm = LLMEngine(
        model,
        quantization=quantization,
        dtype=dtype,
        device=args.device,
        max_num_seqs=max(args.num_prompts, 1),
        max_model_len=args.input_len + args.output_len + 1,
        # Room for every request at once, and no more: a default 1 GiB pool would dwarf a small model.
        num_kv_blocks=max(args.num_prompts, 1) * (-(-(args.input_len + args.output_len + 1) // 16) + 1),
    )
    try:
        vocab = llm.spec.vocab_size
        params = SamplingParams(max_tokens=args.output_len, temperature=0, ignore_eos=True)
        llm.generate([prompts(1, args.input_len, vocab, args.seed + 99)[0]], params)  # warm-up
        batch = prompts(args.num_prompts, args.input_len, vocab, args.seed)
        single = prompts(args.single_prompts, args.input_len, vocab, args.seed + 1)
        return {
            "quantization": quantization,
            "dtype": dtype,
            "batch_tokens_per_s": tokens_per_s(llm, batch, params, one_at_a_time=False),
            "single_tokens_per_s": tokens_per_s(llm, single, params, one_at_a_time=True),
        }
    finally:
        llm.close()


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model
        if model is None:
            from engine.tiny_model import make_tiny_model

            model = str(make_tiny_model(Path(tmp) / "tiny", "llama"))
        rows = [run_config(model, *c.split(":"), args) for c in args.configs.split(",")]
    base = rows[0]
    for r in rows:
        r["batch_vs_first"] = r["batch_tokens_per_s"] / base["batch_tokens_per_s"]
        r["single_vs_first"] = r["single_tokens_per_s"] / base["single_tokens_per_s"]
        print(
            f"{r['quantization']:>5}:{r['dtype']:<9} batch {r['batch_tokens_per_s']:8.1f} tok/s "
            f"({r['batch_vs_first']:.2f}x)   one at a time {r['single_tokens_per_s']:7.1f} tok/s "
            f"({r['single_vs_first']:.2f}x)"
        )
    result = {
        "command": " ".join(sys.argv),
        "model": args.model or "tiny (random)",
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "processor": platform.processor(),
        },
        "workload": {
            k: getattr(args, k) for k in ("num_prompts", "single_prompts", "input_len", "output_len")
        },
        "results": rows,
    }
    out = args.out or RESULTS / f"quantized-{time.strftime('%Y%m%d-%H%M%S')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(f"wrote {out}")
    return result


if __name__ == "__main__":
    main()
