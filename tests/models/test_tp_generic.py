"""Tensor parallelism on the generic path: a transformers model split over 2 gloo ranks (CPU, fp32) computes the
same hidden states and logits as the single-process generic model, each rank holding about half the weights.

The vocabulary is 321 (odd), so the last rank's head and embedding carry one padded row.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers

from engine import checkpoint
from engine.attention.backend import get_attention_backend
from engine.distributed.group import TPGroup
from engine.models.config import UnsupportedModelError
from engine.models.generic.load import load_transformers_model
from tests.helpers.checkpoint_reads import ReadLog
from tests.helpers.model_helpers import metadata
from tests.helpers.tp_ranks import run_on_ranks

TINY = {"hidden_size": 32, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "vocab_size": 321}
CASES = {
    "qwen3": ("qwen3", {}),  # explicit head_dim (32) wider than hidden / heads, q/k norms kept whole
    "gemma2-mqa": ("gemma2", {"num_kv_heads": 1}),  # one KV head for two ranks: replicated; soft-capping
    "gemma3-tied": ("gemma3", {"tie_word_embeddings": True}),  # scaled embedding shared with the head
    # q/k/v fused per head in one colwise projection; the checkpoint's `embed_out` is the model's `lm_head`.
    "gpt_neox": ("gpt_neox", {}),
}
BLOCK = 4
PROMPTS = [list(range(3, 14)), [40, 7, 300, 5, 320]]  # 11 and 5 tokens; 320 is the last real vocabulary id


def _paged_steps(group: TPGroup, model_dir: str) -> dict:
    """On each rank: load the shard, prefill two sequences in one step, then decode one token each."""
    log = ReadLog()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "safe_open", log.open)
        net, call = load_transformers_model(Path(model_dir), torch.float32, torch.device("cpu"), tp=group)
    net.attn_backend = get_attention_backend("torch", torch.device("cpu"))
    layers = net.hf.config.get_text_config().num_hidden_layers
    shape = (16, BLOCK, call.num_kv_heads, call.head_dim)  # this rank's KV heads
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(layers)]
    blocks = [[5, 1, 9], [2, 7]]
    lens = [len(p) for p in PROMPTS]
    with torch.inference_mode():
        ids = torch.tensor(PROMPTS[0] + PROMPTS[1])
        pos = torch.tensor(list(range(lens[0])) + list(range(lens[1])))
        meta = metadata([(0, lens[0], blocks[0]), (0, lens[1], blocks[1])], BLOCK)
        hidden = net(ids, pos, caches, meta)
        prefill = net.compute_logits(hidden[[lens[0] - 1, sum(lens) - 1]])
        meta = metadata([(lens[0], 1, blocks[0]), (lens[1], 1, blocks[1])], BLOCK)
        hidden2 = net(torch.tensor([17, 250]), torch.tensor(lens), caches, meta)
        decode = net.compute_logits(hidden2)
    params = list(net.parameters())  # a tied weight once
    return {  # numpy, not tensors: a queue passes tensors as shared memory, gone when the rank exits
        "hidden": hidden.numpy(),
        "prefill": None if prefill is None else prefill.numpy(),
        "decode": None if decode is None else decode.numpy(),
        "heads": (call.num_heads, call.num_kv_heads),
        "matrix_bytes": sum(p.numel() * p.element_size() for p in params if p.dim() >= 2),
        "vector_bytes": sum(p.numel() * p.element_size() for p in params if p.dim() < 2),
        "vocab_size": net.vocab_size,
        "whole_matrices": log.whole(),
    }


@pytest.fixture(scope="module", params=list(CASES))
def case(request, tiny_model_dir):
    arch, overrides = CASES[request.param]
    model_dir = str(tiny_model_dir(arch, **{**TINY, **overrides}))
    (single,), ranks = run_on_ranks(1, _paged_steps, model_dir), run_on_ranks(2, _paged_steps, model_dir)
    for result in (single, *ranks):
        for key in ("hidden", "prefill", "decode"):
            result[key] = None if result[key] is None else torch.from_numpy(result[key])
    return request.param, single, ranks


def test_two_ranks_match_one_process(case):
    _, single, (first, second) = case
    assert single["prefill"].shape == (2, TINY["vocab_size"])
    assert first["vocab_size"] == TINY["vocab_size"]
    for rank in (first, second):  # the hidden states after the final norm are whole on every rank
        torch.testing.assert_close(rank["hidden"], single["hidden"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first["prefill"], single["prefill"], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(first["decode"], single["decode"], atol=1e-4, rtol=1e-4)
    assert second["prefill"] is None and second["decode"] is None  # logits are gathered on rank 0 only


def test_each_rank_reports_its_own_heads(case):
    name, single, (first, second) = case
    heads, kv_heads = single["heads"]
    want = (heads // 2, max(1, kv_heads // 2))  # one KV head is replicated, not halved
    assert first["heads"] == second["heads"] == want


def test_each_rank_holds_half_the_matrices(case):
    name, single, ranks = case
    # Every matrix read as this rank's slice; the one KV head both ranks hold is all of k_proj and v_proj.
    replicated = ("k_proj", "v_proj") if name == "gemma2-mqa" else ()
    for r in ranks:
        assert [n for n in r["whole_matrices"] if n.split(".")[-2] not in replicated] == []
    # Norms (and other vectors) are whole on every rank.
    assert all(r["vector_bytes"] <= single["vector_bytes"] for r in ranks)
    if name == "gemma2-mqa":  # its k/v projections are whole on both ranks
        assert all(r["matrix_bytes"] < 0.6 * single["matrix_bytes"] for r in ranks)
        return
    # Exactly half, plus the padded vocabulary row (321 -> 322) of the embedding and of an untied head.
    tables = 1 if name.endswith("tied") else 2
    padding = tables * TINY["hidden_size"] * 4
    assert ranks[0]["matrix_bytes"] == ranks[1]["matrix_bytes"]
    assert 2 * ranks[0]["matrix_bytes"] == single["matrix_bytes"] + padding


@pytest.mark.parametrize(
    ("arch", "overrides", "message"),
    [
        ("phi3", {}, r"splits layers\.\*\.self_attn\.qkv_proj as 'colwise_gather_output'"),
        ("mixtral", {}, r"mixture-of-experts layers \(.*num_local_experts\) are not split"),
        ("qwen3", {"num_heads": 3, "num_kv_heads": 1}, r"num_attention_heads=3 cannot be split evenly"),
        ("qwen3", {"num_heads": 6, "num_kv_heads": 3}, r"num_key_value_heads=3 cannot be split evenly"),
        ("qwen3", {"intermediate_size": 101}, r"intermediate_size=101 cannot be split evenly"),
    ],
)
def test_refuses_what_cannot_split(tiny_model_dir, arch, overrides, message):
    model_dir = tiny_model_dir(arch, **{**TINY, **overrides})
    # Refused before any collective: one process stands for rank 0 of 2 without a process group.
    with pytest.raises(UnsupportedModelError, match=message):
        load_transformers_model(model_dir, torch.float32, torch.device("cpu"), tp=TPGroup(0, 2))


def test_refuses_a_model_without_a_tp_plan(tiny_model_dir, monkeypatch):
    model_dir = tiny_model_dir("qwen3", **TINY)
    monkeypatch.setattr(transformers.Qwen3Config, "base_model_tp_plan", None)
    with pytest.raises(UnsupportedModelError, match=r"Qwen3ForCausalLM: .*declares no tensor-parallel plan"):
        load_transformers_model(model_dir, torch.float32, torch.device("cpu"), tp=TPGroup(0, 2))


def test_refuses_a_plan_that_names_no_module(tiny_model_dir, monkeypatch):
    model_dir = tiny_model_dir("qwen3", **TINY)
    monkeypatch.setattr(transformers.Qwen3Config, "base_model_tp_plan", {"blocks.*.attn.wq": "colwise"})
    with pytest.raises(UnsupportedModelError, match=r"names none of its linear layers"):
        load_transformers_model(model_dir, torch.float32, torch.device("cpu"), tp=TPGroup(0, 2))
