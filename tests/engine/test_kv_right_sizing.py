"""The right-sizing rule of docs/operations.md ("Tuning") against what the engine allocates and admits.

    KV bytes per user = ceil(tokens / block_size) * block_size * num_layers * 2 * num_kv_heads * head_dim * dtype bytes

A pool of N such users' blocks is exactly the bytes the engine allocates for N * ceil(tokens / block_size)
blocks, and it runs N sequences of that length at once without a preemption; a block less, it cannot."""

from __future__ import annotations

import json

import pytest

from engine import LLMEngine, SamplingParams
from engine.kv_sizing import bytes_per_user, kv_bytes_per_block


def per_user_bytes(config: dict, tokens: int, block_size: int, dtype_bytes: int) -> int:
    """The documented rule, from config.json alone."""
    head_dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
    per_token = config["num_hidden_layers"] * 2 * config["num_key_value_heads"] * head_dim * dtype_bytes
    return -(-tokens // block_size) * block_size * per_token


def run_users(model_dir, users: int, tokens: int, block_size: int, num_kv_blocks: int):
    """`users` sequences of `tokens` tokens (prompt 5 + forced answer) all at once; returns the engine and
    the most sequences one step computed."""
    engine = LLMEngine(
        str(model_dir),
        device="cpu",
        block_size=block_size,
        num_kv_blocks=num_kv_blocks,
        max_num_seqs=users,
        enable_prefix_caching=False,
    )
    params = SamplingParams(max_tokens=tokens - 5, temperature=0, ignore_eos=True)
    for u in range(users):
        engine.add_request(f"u{u}", [10 + u, 11, 12, 13, 14], params)
    most = 0
    while engine.has_unfinished_requests():
        engine.step()
        most = max(most, len(engine.step_tokens()))
    return engine, most


@pytest.mark.parametrize("block_size,tokens", [(16, 40), (8, 21)])
def test_the_rule_matches_the_pool_the_engine_allocates_and_fills(tiny_model_dir, block_size, tokens):
    model_dir = tiny_model_dir()
    config = json.loads((model_dir / "config.json").read_text())
    users = 3
    blocks = users * -(-tokens // block_size)
    engine, most = run_users(model_dir, users, tokens, block_size, blocks)
    pool = engine.runner.kv_pool
    rule = per_user_bytes(config, tokens, block_size, 4)
    assert pool.numel() * pool.element_size() == users * rule
    # The engine's own copy of the rule (engine/kv_sizing.py, what `conveyor plan` prints) agrees.
    head_dim = config["hidden_size"] // config["num_attention_heads"]
    block = kv_bytes_per_block(
        block_size, config["num_hidden_layers"], config["num_key_value_heads"], head_dim, 4
    )
    assert bytes_per_user(tokens, block_size, block) == rule
    assert most == users and engine.stats().num_preemptions == 0
    engine.close()
    short, most = run_users(model_dir, users, tokens, block_size, blocks - 1)
    assert short.stats().num_preemptions > 0 or most < users
    short.close()
