"""Quantization under tensor parallelism: each of two gloo ranks quantizes its shard.

int4 groups of 32 fall on the same columns whether down_proj and o_proj are split in two or not (the tiny
model's 64 and 128 input columns split on 32-blocks), so two ranks hold exactly the codes one process
holds and generate the same greedy tokens (the all_reduce sums the same partial products in another order:
fp32 rounding only, below this model's logit gaps on these prompts)."""

from __future__ import annotations

from engine import LLMEngine, SamplingParams

OPTIONS = {"quantization": "int4", "num_kv_blocks": 16, "block_size": 8, "max_model_len": 64}


def test_two_ranks_int4_generate_what_one_process_does(tiny_model_dir):
    model = str(tiny_model_dir("llama"))
    prompts = [[5, 17, 300, 42, 7, 99], [250, 3, 61, 128, 9, 400, 11, 12, 13]]
    greedy = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    with LLMEngine(model, **OPTIONS) as one:
        want = [o.outputs[0].token_ids for o in one.generate(prompts, greedy)]
    with LLMEngine(model, tensor_parallel_size=2, **OPTIONS) as two:
        got = [o.outputs[0].token_ids for o in two.generate(prompts, greedy)]
    assert got == want
