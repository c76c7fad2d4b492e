"""A GGUF file under tensor parallelism (two gloo ranks on the CPU): each rank reads its rows of the file
(for Llama's q/k, rows of the un-permuted order) and the pair generates what one process does on the source
checkpoint."""

from __future__ import annotations

import pytest

from engine import LLMEngine, SamplingParams

pytestmark = pytest.mark.slow  # two spawned ranks per case, and the single-process reference

GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 17, 99, 230, 7, 41, 300], [12, 13, 14]]


@pytest.mark.parametrize(("arch", "options"), [("llama", {}), ("gemma2", {"model_impl": "transformers"})])
def test_two_ranks_on_a_gguf_file_generate_what_the_source_does(tiny_gguf, arch, options):
    folder, path = tiny_gguf(arch)
    common = {
        "attention_backend": "torch",
        "block_size": 8,
        "num_kv_blocks": 32,
        "dtype": "float32",
        **options,
    }
    expected = [o.token_ids for o in LLMEngine(str(folder), **common).generate(PROMPTS, GREEDY)]
    tp = LLMEngine(str(path), tensor_parallel_size=2, **common)
    try:
        got = [o.token_ids for o in tp.generate(PROMPTS, GREEDY)]
    finally:
        tp.close()
    assert got == expected
