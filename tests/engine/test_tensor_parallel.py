"""LLMEngine with tensor_parallel_size=2 (two gloo ranks on the CPU, fp32) against the single-process engine.

One engine per model runs a workload built to pass through every scheduler path at once: prompts of mixed
lengths, chunked prefill (max_num_batched_tokens 16 < the longest prompt), preemption (9 KV blocks of 8
tokens for about 14 blocks of work), an n=2 fork, and a second wave that hits the prefix cache. Each start
costs seconds (a spawned rank imports torch), so the cases are few and share that workload.
"""

from __future__ import annotations

import random

import pytest

from engine import LLMEngine, SamplingParams
from tests.helpers.hf_reference import greedy_agrees, hf_model

COMMON = {"block_size": 8, "max_num_batched_tokens": 16, "num_kv_blocks": 9, "max_model_len": 64}
# name -> (tiny arch, its overrides, engine options)
MODELS = {
    "llama": ("llama", {}, {}),
    "qwen3-head-dim": ("qwen3", {"head_dim": 32}, {}),  # q width 4 * 32 != hidden size 64
    "gqa-one-kv-head": ("llama", {"num_heads": 4, "num_kv_heads": 1}, {}),  # fewer KV heads than ranks
    # The generic path: the model's own transformers modules, sharded from its base_model_tp_plan.
    "generic-gemma2": ("gemma2", {}, {"model_impl": "transformers"}),
}


def _prompts(seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """(first wave, second wave): token-id prompts; the second wave repeats the first prompt's prefix."""
    rng = random.Random(seed)

    def ids(n: int) -> list[int]:
        return [rng.randrange(3, 500) for _ in range(n)]

    long = ids(30)
    first = [long, ids(5), ids(11)]
    second = [long[:24] + ids(4), ids(7)]
    return first, second


def _run(engine: LLMEngine, waves: tuple[list[list[int]], list[list[int]]]) -> list[list[int]]:
    """Greedy token ids of every sample, wave after wave (the last prompt of the first wave has n=2)."""
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    forked = greedy.model_copy(update={"n": 2})
    first, second = waves
    outs = engine.generate(first, [greedy] * (len(first) - 1) + [forked])
    outs += engine.generate(second, greedy)
    return [s.token_ids for o in outs for s in o.outputs]


def _prompt_of_each_sample(waves: tuple[list[list[int]], list[list[int]]]) -> list[list[int]]:
    first, second = waves
    return first + [first[-1]] + second


@pytest.mark.parametrize("name", list(MODELS))
def test_two_ranks_generate_what_one_process_does(tiny_model_dir, name):
    arch, overrides, options = MODELS[name]
    model = str(tiny_model_dir(arch, **overrides))
    waves = _prompts(seed=len(name))
    expected = _run(LLMEngine(model, attention_backend="torch", **COMMON, **options), waves)
    tp = LLMEngine(model, attention_backend="torch", tensor_parallel_size=2, **COMMON, **options)
    try:
        # Rank 0's KV pool holds only its own KV heads (one of the model's, or the one replicated).
        kv_heads = overrides.get("num_kv_heads", 2)
        assert tp.runner.kv_pool.shape[4] == tp.spec.num_kv_heads == max(1, kv_heads // 2)
        got = _run(tp, waves)
        stats = tp.stats()
    finally:
        tp.close()
    assert tp.ranks is not None and [p.exitcode for p in tp.ranks.procs] == [0]  # STOP: a clean exit
    assert stats.num_preemptions > 0, "the workload was meant to preempt"
    assert stats.prefix_cache_hits > 0, "the second wave was meant to hit the prefix cache"
    reference = hf_model(model)
    for prompt, g, e in zip(_prompt_of_each_sample(waves), got, expected, strict=True):
        assert greedy_agrees(reference, prompt, g, e), (name, prompt, g, e)


def test_two_ranks_on_the_triton_backend(tiny_model_dir):
    """Triton kernels (the interpreter on the CPU) on both ranks: one short mixed batch."""
    model = str(tiny_model_dir("llama"))
    prompts = [[5, 9, 17, 33, 65, 129, 257, 11, 13], [7, 3, 99]]
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    expected = LLMEngine(model, attention_backend="torch").generate(prompts, params)
    tp = LLMEngine(model, attention_backend="triton", tensor_parallel_size=2, num_kv_blocks=16)
    try:
        assert tp.model.attn_backend.name == "triton"
        got = tp.generate(prompts, params)
    finally:
        tp.close()
    reference = hf_model(model)
    for prompt, g, e in zip(prompts, got, expected, strict=True):
        assert greedy_agrees(reference, prompt, g.outputs[0].token_ids, e.outputs[0].token_ids)


def test_tensor_parallel_refuses_cuda_graphs():
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        LLMEngine("unused", tensor_parallel_size=2, enable_cuda_graphs=True, attention_backend="triton")
