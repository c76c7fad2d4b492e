"""block_size 8 runs on the torch backend only: refused when the config is made, not at the first forward."""

from __future__ import annotations

import pytest
import torch

import engine.llm_engine as llm_engine
from engine.attention.triton_backend import TritonAttentionBackend
from engine.config import EngineConfig
from kernels.block_sizes import TRITON_BLOCK_SIZES
from kernels.paged_attention import paged_attention


@pytest.mark.parametrize(
    "options",
    [{"attention_backend": "triton"}, {"device": "cuda"}, {"device": "cuda:1", "attention_backend": "auto"}],
)
def test_config_refuses_block_8_with_triton(options):
    with pytest.raises(ValueError, match="block_size 8 is not supported by the triton attention backend"):
        EngineConfig(model="m", block_size=8, **options)


def test_block_8_stays_allowed_on_the_torch_backend():
    EngineConfig(model="m", block_size=8, device="cpu")
    EngineConfig(model="m", block_size=8, device="cuda", attention_backend="torch")


def test_engine_refuses_before_the_kv_pool_when_auto_resolves_to_triton(monkeypatch, tiny_model):
    # device "auto" is only known to be CUDA (-> triton) once resolved; stand in for that resolution.
    monkeypatch.setattr(llm_engine, "get_attention_backend", lambda name, device: TritonAttentionBackend())

    def no_pool(*args, **kwargs):
        raise AssertionError("the model and its KV pool were built before the refusal")

    monkeypatch.setattr(llm_engine, "build_rank_runner", no_pool)
    with pytest.raises(ValueError, match="block_size 8 is not supported"):
        llm_engine.LLMEngine(tiny_model, block_size=8, num_kv_blocks=16)


@pytest.mark.parametrize("block_size", [8, 16])
def test_the_launcher_takes_exactly_the_configs_sizes(block_size):
    q = torch.zeros(1, 2, 16)
    cache = torch.zeros(4, block_size, 2, 16)
    tables = torch.zeros(1, 4, dtype=torch.int32)
    seq_lens = torch.tensor([1], dtype=torch.int32)
    starts = torch.tensor([0, 1], dtype=torch.int32)
    if block_size in TRITON_BLOCK_SIZES:
        paged_attention(q, cache, cache, tables, seq_lens, starts, 1, 1, 1.0)
    else:
        with pytest.raises(ValueError, match="block_size must be one of"):
            paged_attention(q, cache, cache, tables, seq_lens, starts, 1, 1, 1.0)
