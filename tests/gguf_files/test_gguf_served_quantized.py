"""A GGUF file's own quantized blocks reach the engine (engine/model_loader.py -> engine/quant): with
quantization `auto` a Q4_1 or Q8_0 file is served in its own precision where the kernels are fast (bfloat16
activations), dequantized on a float32 CPU engine; `int4` by name takes the file's blocks there too, and
in float32 the int4 op reads them back exactly, so its greedy tokens equal the dequantized engine's."""

from __future__ import annotations

import pytest
import torch

from engine import LLMEngine, SamplingParams
from engine.quant.linear import QuantLinear

GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
PROMPTS = [[5, 9, 14, 3, 27, 8], [40, 2, 2, 19]]


def _engine(path, dtype: str, quantization: str = "auto") -> LLMEngine:
    return LLMEngine(
        str(path), dtype=dtype, device="cpu", num_kv_blocks=64, block_size=16, quantization=quantization
    )


def _kinds(engine: LLMEngine) -> set[str]:
    return {m.kind for m in engine.model.modules() if isinstance(m, QuantLinear)}


@pytest.mark.parametrize(
    ("qtype", "kind"), [("Q4_1", "int4 g32 (Q4_1 blocks)"), ("Q4_0", "int4 g32 (Q4_0 blocks)")]
)
def test_auto_serves_the_files_own_int4_blocks_with_bfloat16_activations(tiny_gguf, qtype, kind):
    _, path = tiny_gguf("llama", qtype)
    assert _kinds(_engine(path, "bfloat16")) == {kind}


def test_auto_dequantizes_on_a_float32_cpu_engine(tiny_gguf):
    _, path = tiny_gguf("llama", "Q4_1")
    assert _kinds(_engine(path, "float32")) == set()


def test_int4_by_name_serves_the_blocks_exactly_in_float32(tiny_gguf):
    _, path = tiny_gguf("llama", "Q4_1")
    packed = _engine(path, "float32", "int4")
    assert _kinds(packed) == {"int4 g32 (Q4_1 blocks)"}
    dequantized = _engine(path, "float32")
    got = [o.token_ids for o in packed.generate(PROMPTS, GREEDY)]
    assert got == [o.token_ids for o in dequantized.generate(PROMPTS, GREEDY)]
    # and not by luck: the logits of one forward agree to float32 rounding
    params = SamplingParams(max_tokens=1, temperature=0, prompt_logprobs=0)
    a, b = (e.generate([PROMPTS[0]], params)[0].prompt_logprobs for e in (packed, dequantized))
    assert a is not None and b is not None
    assert torch.allclose(
        torch.tensor([e[0][1] for e in a[1:]]), torch.tensor([e[0][1] for e in b[1:]]), atol=1e-4
    )
