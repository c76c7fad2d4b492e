"""The seeded benchmark workload shared by the throughput and Redis benchmarks, and its model."""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Job:
    prompt_token_ids: list[int]
    max_tokens: int
    ignore_eos: bool = True  # False: the answer may end at the model's EOS before max_tokens


def make_workload(
    num_requests: int = 256,
    min_prompt: int = 16,
    max_prompt: int = 512,
    max_output: int = 512,
    vocab_size: int = 32000,
    seed: int = 0,
    shared_prefix: int = 0,
    output_median: int | None = None,
) -> list[Job]:
    """Prompt lengths uniform in [min_prompt, max_prompt]; output lengths capped at max_output and
    heavy-tailed: Pareto (alpha 1.2, scale 16: most requests short, a few long, as in chat traffic) by
    default, or log-normal around `output_median` (sigma 0.6) when given. With `shared_prefix`, every
    prompt starts with the same that many tokens (a system prompt)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(3, vocab_size) for _ in range(shared_prefix)]
    jobs = []
    for _ in range(num_requests):
        n = rng.randint(min_prompt, max_prompt)
        tail = [rng.randrange(3, vocab_size) for _ in range(max(1, n - len(prefix)))]
        if output_median is None:
            out = int(16 * rng.paretovariate(1.2))
        else:
            out = int(rng.lognormvariate(math.log(output_median), 0.6))
        jobs.append(Job(prompt_token_ids=prefix + tail, max_tokens=max(1, min(max_output, out))))
    return jobs


@dataclass(frozen=True)
class Workload:
    """A named benchmark workload: the requests and the batch limit they are served at."""

    num_requests: int
    max_prompt: int
    max_output: int
    max_batch: int
    output_median: int | None = None  # None: Pareto outputs; else log-normal around this median
    min_prompt: int = 16

    def jobs(self, seed: int = 0) -> list[Job]:
        return make_workload(
            self.num_requests,
            min_prompt=self.min_prompt,
            max_prompt=self.max_prompt,
            max_output=self.max_output,
            seed=seed,
            output_median=self.output_median,
        )


WORKLOADS = {
    # The README's workload: prefill-heavy (65,887 prompt vs 16,401 output tokens).
    "chat": Workload(num_requests=256, max_prompt=512, max_output=512, max_batch=64),
    # A decode-heavier one: short prompts, outputs log-normal around 70 up to 256, batch 32.
    "decode": Workload(num_requests=64, max_prompt=256, max_output=256, max_batch=32, output_median=70),
}


# About 50M parameters: hidden 512, 8 layers, vocab 32000 (embeddings and head untied).
BENCH_MODEL = dict(
    hidden_size=512,
    num_layers=8,
    num_heads=8,
    num_kv_heads=8,
    intermediate_size=1408,
    vocab_size=32000,
    max_position_embeddings=2048,
    tie_word_embeddings=False,
)


# Random-weight stand-ins with the shapes of published models, for GPU end-to-end runs.
SHAPES: dict[str, tuple[str, dict]] = {
    "bench-50m": ("llama", BENCH_MODEL),
    "qwen2.5-0.5b": (
        "qwen2",
        dict(
            hidden_size=896,
            num_layers=24,
            num_heads=14,
            num_kv_heads=2,
            intermediate_size=4864,
            vocab_size=151936,
            max_position_embeddings=32768,
            tie_word_embeddings=True,
            rope_theta=1000000.0,
            torch_dtype="bfloat16",
        ),
    ),
    "llama-8b": (
        "llama",
        dict(
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
            max_position_embeddings=8192,
            tie_word_embeddings=False,
            rope_theta=500000.0,
            torch_dtype="bfloat16",
        ),
    ),
}


def bench_model_dir(cache_dir: Path, arch: str = "llama", **overrides: object) -> Path:
    """Build (once) a random-weight model under cache_dir (the ~50M benchmark model unless overridden)."""
    from engine.tiny_model import make_tiny_model

    shape = {**BENCH_MODEL, **overrides}
    name = f"bench-{arch}-" + "-".join(f"{k}{v}" for k, v in sorted(shape.items()))
    out = cache_dir / name
    if not (out / "config.json").exists():
        tmp = out.with_name(out.name + ".partial")
        make_tiny_model(tmp, arch=arch, seed=0, **shape)
        tmp.rename(out)
    return out


def bench_engine(model_dir: Path | str, args: object, **options: object):
    """LLMEngine at the benchmark's batch limits (`args.max_batch`, `.max_batched_tokens`, `.kv_blocks`) and
    `args.quantization` where given (benchmarks/served.py)."""
    from benchmarks.served import quantization_options
    from engine import LLMEngine

    return LLMEngine(
        str(model_dir),
        max_num_seqs=args.max_batch,
        max_num_batched_tokens=args.max_batched_tokens,
        num_kv_blocks=args.kv_blocks,
        block_size=16,
        **quantization_options(getattr(args, "quantization", None)),
        **options,
    )
