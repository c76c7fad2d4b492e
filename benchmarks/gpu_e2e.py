"""The engine on a GPU, end to end, against transformers on the same weights: correctness, then speed.

    python benchmarks/gpu_e2e.py --part tokens --model DIR|FILE.gguf --out tokens.json
    python benchmarks/gpu_e2e.py --part speed  --model DIR --out speed.json
    python benchmarks/gpu_e2e.py --part tokens --dry-run --model DIR ...   # CPU, fp32, interpreter, tiny

Modes, each a fresh LLMEngine on the Triton backend: `eager`, `cuda_graphs` (enable_cuda_graphs), `async`
(async_scheduling). A dry run has no CUDA graphs.

--part tokens: greedy tokens of each mode against transformers' `generate` (bf16, same weights, same
prompts, one prompt at a time). A sequence agrees when it is equal, or first differs where transformers'
two candidates are a bf16 tie (hf_baselines.agrees). Exit 1 if any sequence of any mode does not agree.

--part speed (warm: a warm-up batch first, so Triton's compiles are outside every timing), per mode:
  tokens_per_s          output tokens/s over the whole batch (all requests queued at once)
  first_token_idle_ms   one request on an idle engine: submit to its first token (median of 3)
  first_token_p50/p99_ms  under the batch: each request's first token after the batch was queued
  step_ms, forward_ms   mean wall time of engine.step() and GPU time of the model forward (CUDA events)
                        over the same steps; their difference is host work (scheduling, inputs,
                        sampling, output) that async scheduling overlaps with the forward. No forward
                        time under CUDA graphs (the forward is a graph replay)
and transformers on the same prompts and batch: `generate` (static batching, left-padded) and
`generate_batch` (its continuous batching).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

if "--dry-run" in sys.argv:  # must precede any triton kernel import
    os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import hf_baselines  # noqa: E402
from engine import LLMEngine, SamplingParams  # noqa: E402

TINY = dict(hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=512)
MODES = {"eager": {}, "cuda_graphs": {"enable_cuda_graphs": True}, "async": {"async_scheduling": True}}


def vocab_size(model: Path) -> int:
    if model.suffix == ".gguf":
        from gguf import GGUFReader

        reader = GGUFReader(str(model))
        return len(reader.fields["tokenizer.ggml.tokens"].data)
    return json.loads((model / "config.json").read_text())["vocab_size"]


def prompts(n: int, lo: int, hi: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def engine(model: Path, mode: str, a: argparse.Namespace, batch: int, longest: int) -> LLMEngine:
    blocks = batch * -(-longest // 16) + 64
    return LLMEngine(
        str(model),
        dtype=a.dtype,
        device=a.device,
        attention_backend="triton",
        block_size=16,
        max_num_seqs=batch,
        max_num_batched_tokens=4096,
        num_kv_blocks=blocks,
        max_model_len=longest,  # the graphs' block tables and capture ladder as wide as this run needs
        quantization=a.quantization,
        **MODES[mode],
        **({"tensor_parallel_size": a.tensor_parallel_size} if a.tensor_parallel_size > 1 else {}),
    )


def free_device_memory() -> None:
    """After an engine is closed and dropped: its KV cache back to the device before the next one is built."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def run_batch(eng: LLMEngine, batch: list[list[int]], new_tokens: int, timing: dict | None = None) -> dict:
    """Greedy, exactly new_tokens each; returns {index: tokens}. With `timing`: fills its figures."""
    params = SamplingParams(max_tokens=new_tokens, temperature=0, ignore_eos=True)
    start = time.perf_counter()
    for i, p in enumerate(batch):
        eng.add_request(str(i), p, params)
    tokens: dict[int, list[int]] = {}
    first: dict[int, float] = {}
    steps: list[float] = []
    while eng.has_unfinished_requests():
        t0 = time.perf_counter()
        deltas = eng.step()
        steps.append(time.perf_counter() - t0)
        for d in deltas:
            i = int(d.request_id)
            if d.new_token_ids and i not in first:
                first[i] = time.perf_counter() - start
            tokens.setdefault(i, []).extend(d.new_token_ids)
    if eng.device.type == "cuda":
        torch.cuda.synchronize()
    if timing is not None:
        seconds = time.perf_counter() - start
        produced = sum(map(len, tokens.values()))
        firsts = sorted(first.values())
        timing.update(
            output_tokens=produced,
            seconds=seconds,
            tokens_per_s=produced / seconds,
            first_token_p50_ms=1e3 * firsts[len(firsts) // 2],
            first_token_p99_ms=1e3 * firsts[min(len(firsts) - 1, int(0.99 * len(firsts)))],
            steps=len(steps),
            step_ms=1e3 * statistics.fmean(steps),
        )
    return tokens


class ForwardTimer:
    """CUDA events around every model forward of `eng`: GPU time of the forwards, in ms."""

    def __init__(self, eng: LLMEngine) -> None:
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        model = eng.runner.model
        forward = model.forward

        def timed(*args, **kwargs):
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            out = forward(*args, **kwargs)
            end.record()
            self.pairs.append((begin, end))
            return out

        model.forward = timed

    def mean_ms(self) -> float | None:
        torch.cuda.synchronize()
        times = [b.elapsed_time(e) for b, e in self.pairs]
        return statistics.fmean(times) if times else None


def part_tokens(model: Path, a: argparse.Namespace) -> dict:
    vocab = vocab_size(model)
    batch = prompts(a.check_prompts, 8, a.check_prompt_max, vocab, seed=1)
    net = hf_baselines.load(model, a.torch_dtype, a.device)
    ref = [hf_baselines.greedy(net, p, a.check_tokens) for p in batch]
    report, bad = {}, []
    for mode in a.modes:
        eng = engine(model, mode, a, len(batch), a.check_prompt_max + a.check_tokens)
        try:
            got = run_batch(eng, batch, a.check_tokens)
        finally:
            eng.close()
        del eng
        free_device_memory()
        rows = [hf_baselines.agrees(net, p, got.get(i, []), ref[i]) for i, p in enumerate(batch)]
        report[mode] = {
            "sequences": len(rows),
            "exact": sum(r["exact"] for r in rows),
            "agree": sum(r["agrees"] for r in rows),
            "first_differences": [r["first_difference"] for r in rows],
        }
        if not all(r["agrees"] for r in rows):
            bad.append(mode)
        print(f"tokens {mode}: {report[mode]}")
    report["wrong_modes"] = bad
    return report


def part_speed(model: Path, a: argparse.Namespace) -> dict:
    vocab = vocab_size(model)
    work = prompts(a.num_requests, a.min_prompt, a.max_prompt, vocab, seed=2)
    warm = prompts(min(16, a.num_requests), a.min_prompt, a.max_prompt, vocab, seed=3)
    longest = a.max_prompt + a.new_tokens
    report: dict = {
        "workload": {"requests": len(work), "prompt_tokens": sum(map(len, work)), "new_tokens": a.new_tokens}
    }
    for mode in a.modes:
        eng = engine(model, mode, a, a.num_requests, longest)
        try:
            run_batch(eng, warm, min(8, a.new_tokens))  # compiles, graph capture already done at start
            idle = []
            for _ in range(3):
                t = {}
                run_batch(eng, [work[0]], 1, t)
                idle.append(t["seconds"] * 1e3)
            timer = ForwardTimer(eng) if eng.device.type == "cuda" and mode != "cuda_graphs" else None
            timing: dict = {}
            run_batch(eng, work, a.new_tokens, timing)
            timing["first_token_idle_ms"] = statistics.median(idle)
            timing["forward_ms"] = timer.mean_ms() if timer else None
        finally:
            eng.close()
        del eng
        free_device_memory()
        report[mode] = timing
        print(f"speed {mode}: {timing}")
    net = hf_baselines.load(model, a.torch_dtype, a.device)
    hf_baselines.generate_throughput(net, warm[:2], 2, 2)  # warm-up
    for name, fn in (
        ("hf_generate", hf_baselines.generate_throughput),
        ("hf_generate_batch", hf_baselines.batch_throughput),
    ):
        try:
            report[name] = fn(net, work, a.new_tokens, a.num_requests)
        except Exception as exc:  # noqa: BLE001 - reported, and the step fails after the other figures
            report[name] = {"not_run": f"{type(exc).__name__}: {str(exc)[:300]}"}
            if not a.dry_run:  # transformers 5.17's generate_batch sizes its cache from GPU memory only
                report.setdefault("failed", []).append(name)
        print(f"speed {name}: {report[name]}")
    return report


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("tokens", "speed"), required=True)
    p.add_argument("--model", type=Path, required=True, help="a checkpoint folder or a .gguf file")
    p.add_argument(
        "--quantization",
        default="none",
        help="the engine's quantization; none (default): a GGUF file dequantized, as transformers reads it",
    )
    p.add_argument("--modes", default=None, help="comma-separated: " + ",".join(MODES))
    p.add_argument("--check-prompts", type=int, default=8)
    p.add_argument("--check-prompt-max", type=int, default=200)
    p.add_argument("--check-tokens", type=int, default=32)
    p.add_argument("--num-requests", type=int, default=256)
    p.add_argument("--min-prompt", type=int, default=128)
    p.add_argument("--max-prompt", type=int, default=1024)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--dry-run", action="store_true", help="CPU, fp32, Triton interpreter, tiny sizes")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    a.device, a.dtype = ("cpu", "float32") if a.dry_run else ("cuda", "bfloat16")
    a.torch_dtype = getattr(torch, a.dtype)
    if a.dry_run:
        a.check_prompts, a.check_prompt_max, a.check_tokens = 2, 20, 3
        a.num_requests, a.min_prompt, a.max_prompt, a.new_tokens = 2, 8, 20, 2
    default_modes = "eager,async" if a.dry_run else ",".join(MODES)
    a.modes = (a.modes or default_modes).split(",")
    torch.manual_seed(0)
    report = part_tokens(a.model, a) if a.part == "tokens" else part_speed(a.model, a)
    report["args"] = {k: str(v) for k, v in vars(a).items()}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {a.out}")
    sys.exit(1 if report.get("wrong_modes") or report.get("failed") else 0)


if __name__ == "__main__":
    main()
