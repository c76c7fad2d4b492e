"""max_model_len is resolved by one rule for every rank (rank_runner.resolve_max_model_len), and the KV pool
is capped by the same value."""

from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.distributed.rank_runner import rank_num_blocks, resolve_max_model_len
from engine.kv_sizing import PREFIX_CACHE_FACTOR
from engine.model_loader import ModelSpec

SPEC = ModelSpec(
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=8,
    hidden_size=16,
    vocab_size=100,
    max_position_embeddings=256,
    dtype=torch.float32,
    eos_token_ids=frozenset({0}),
)


def test_unset_is_the_models_limit_and_more_is_refused():
    assert resolve_max_model_len(None, 256) == 256
    assert resolve_max_model_len(100, 256) == 100
    with pytest.raises(ValueError, match="max_model_len=300 exceeds the model's max_position_embeddings=256"):
        resolve_max_model_len(300, 256)


def test_the_pool_cap_uses_the_resolved_length():
    config = EngineConfig(model="m", max_num_seqs=2, block_size=16)  # max_model_len unset: 256
    # 1 GiB of CPU budget fits far more than the cap.
    assert rank_num_blocks(config, SPEC, None, lambda _memory: 0) == PREFIX_CACHE_FACTOR * 2 * 16
    with pytest.raises(ValueError, match="exceeds"):
        rank_num_blocks(EngineConfig(model="m", max_model_len=512), SPEC, None, lambda _memory: 0)
