"""The native model sharded over two gloo ranks: same logits as one process, 1/N of the weights per rank,
only the rank's slices read from disk, and clear refusals for shapes that do not split."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from engine import checkpoint
from engine.attention.backend import get_attention_backend
from engine.distributed.group import TPGroup
from engine.distributed.partition import padded_vocab
from engine.kv_cache import allocate_kv_pool, layer_views
from engine.model_loader import load_model
from tests.helpers.checkpoint_reads import ReadLog
from tests.helpers.model_helpers import metadata
from tests.helpers.tp_values import values_on_ranks

BLOCK = 4  # the torch backend's; the Triton kernels need >= 16
# name -> make_tiny_model overrides. qwen3: head_dim 32 with hidden 64 / 4 heads (q width != hidden).
# gqa: one KV head for two ranks (replicated), an odd vocabulary (padded to 510) and a tied head.
MODELS = {
    "llama": ("llama", {}),
    "qwen3": ("qwen3", {"head_dim": 32}),
    "gqa": ("llama", {"num_kv_heads": 1, "vocab_size": 509, "tie_word_embeddings": True}),
}
# Two sequences, two steps: prefills of 5 and 8 tokens (the second a chunk of 11), then a decode of the
# first and the last 3-token chunk of the second, which attend to what step one cached.
PROMPTS = {"a": list(range(3, 9)), "b": list(range(20, 31))}
STEPS = [
    [("a", 0, 5, [5, 2]), ("b", 0, 8, [7, 1, 4])],
    [("a", 5, 1, [5, 2]), ("b", 8, 3, [7, 1, 4])],
]


def _forward_steps(model, spec, block: int) -> tuple[list[torch.Tensor | None], list[torch.Tensor]]:
    """Run STEPS on a paged pool; per step (logits of each sequence's last row, the hidden states)."""
    kv = layer_views(allocate_kv_pool(spec, 8, block, "cpu"))
    logits, hiddens = [], []
    for step in STEPS:
        ids = [t for rid, start, n, _ in step for t in PROMPTS[rid][start : start + n]]
        pos = [p for _, start, n, _ in step for p in range(start, start + n)]
        meta = metadata([(start, n, blocks) for _, start, n, blocks in step], block)
        with torch.inference_mode():
            hidden = model(torch.tensor(ids), torch.tensor(pos), kv, meta)
            last = meta.query_start_loc[1:].long() - 1
            logits.append(model.compute_logits(hidden[last]))
        hiddens.append(hidden)
    return logits, hiddens


def _param_bytes(model) -> dict[str, int]:
    """Bytes of the sharded layers, of the vocabulary tables, and of the replicated norms."""
    out = {"layers": 0, "vocab": 0, "norms": 0}
    for name, p in model.named_parameters():
        kind = (
            "vocab"
            if name.startswith(("embed_tokens", "lm_head"))
            else "norms"
            if "norm" in name
            else "layers"
        )
        out[kind] += p.numel() * p.element_size()
    return out


def _on_rank(group: TPGroup, model_dir: Path, backend: str = "torch", block: int = BLOCK):
    log = ReadLog()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(checkpoint, "safe_open", log.open)
        model, spec = load_model(
            model_dir, tp=group, attention_backend=get_attention_backend(backend, torch.device("cpu"))
        )
    logits, hiddens = _forward_steps(model, spec, block)
    kept = {n: p.numel() for n, p in model.named_parameters()}
    return {"spec": spec, "logits": logits, "hidden": hiddens, "bytes": _param_bytes(model)} | {
        "reads": log.reads,
        "full": log.full,
        "kept": kept,
        "kv_bytes": _kv_proj_bytes(model),
    }


def _kv_proj_bytes(model) -> int:
    """Bytes of the k and v rows of every qkv projection on this rank."""
    total = 0
    for layer in model.layers:
        attn = layer.self_attn
        total += 2 * attn.kv_size * attn.qkv_proj.in_features * attn.qkv_proj.weight.element_size()
    return total


@pytest.fixture(scope="module")
def runs(tiny_model_dir):
    """Per model: the single-process result and the two ranks' results (all ranks spawned once per model)."""
    out = {}
    for name, (arch, overrides) in MODELS.items():
        model_dir = tiny_model_dir(arch, **overrides)
        out[name] = (_on_rank(TPGroup.single(), model_dir), values_on_ranks(2, _on_rank, model_dir))
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_two_ranks_give_the_single_process_logits(runs, name):
    single, (r0, r1) = runs[name]
    for step, (got, want) in enumerate(zip(r0["logits"], single["logits"], strict=True)):
        assert got.shape == want.shape == (2, single["spec"].vocab_size)
        # Partial sums reduced across ranks round differently from one matmul: fp32 noise only.
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5, msg=f"step {step}")
    assert r1["logits"] == [None, None]  # logits live on rank 0 only
    for h0, h1 in zip(r0["hidden"], r1["hidden"], strict=True):
        assert torch.equal(h0, h1)  # every rank ends each step with the same hidden states


@pytest.mark.parametrize("name", list(MODELS))
def test_spec_counts_this_ranks_heads(runs, name):
    single, (r0, r1) = runs[name]
    s = single["spec"]
    for r in (r0, r1):
        assert r["spec"].tp_size == 2 and r["spec"].num_heads == s.num_heads // 2
        assert r["spec"].num_kv_heads == max(1, s.num_kv_heads // 2)
        assert r["spec"].vocab_size == s.vocab_size


@pytest.mark.parametrize("name", list(MODELS))
def test_each_rank_holds_half_the_layer_weights(runs, name):
    single, (r0, r1) = runs[name]
    full = single["bytes"]["layers"]
    assert r0["bytes"] == r1["bytes"]
    # Every sharded dimension divides by 2 in these models, so a rank holds exactly half of each layer,
    # except KV heads replicated when there are fewer than the ranks: a rank holds all of those (half
    # again of their bytes over the even split). That replicated part is the whole tolerance.
    replicated_extra = r0["kv_bytes"] - single["kv_bytes"] / 2 if name == "gqa" else 0
    assert r0["bytes"]["layers"] == full / 2 + replicated_extra
    # The vocabulary tables (one when tied) are padded up to an even split: half of the padded rows each.
    vocab = single["spec"].vocab_size
    assert r0["bytes"]["vocab"] * 2 * vocab == single["bytes"]["vocab"] * padded_vocab(vocab, 2)
    assert r0["bytes"]["norms"] == single["bytes"]["norms"]  # replicated


@pytest.mark.parametrize("name", list(MODELS))
def test_a_rank_reads_only_its_slices(runs, name):
    _, ranks = runs[name]
    read = [
        {n: sum(torch.Size(s).numel() for s in shapes) for n, shapes in r["reads"].items()} for r in ranks
    ]
    whole = {n: torch.Size(s).numel() for n, s in ranks[0]["full"].items()}
    kv_replicated = name == "gqa"  # one KV head, two ranks: each reads k_proj and v_proj whole
    for n, total in whole.items():
        if "norm" in n or (kv_replicated and (".k_proj" in n or ".v_proj" in n)):
            assert read[0][n] == read[1][n] == total, n
        else:  # each rank reads less than the tensor; together exactly all of it, once
            assert read[0][n] < total and read[1][n] < total and read[0][n] + read[1][n] == total, n
    for r, got in zip(ranks, read, strict=True):
        # What a rank reads is what it keeps (less the padding rows of the vocabulary it zero-fills).
        assert sum(got.values()) <= sum(r["kept"].values())


def test_triton_backend_on_two_ranks_sees_each_ranks_heads(runs, tiny_model_dir):
    # The Triton kernels (interpreted on the CPU) over the rank's 2 query heads and its replicated KV head.
    arch, overrides = MODELS["gqa"]
    r0, r1 = values_on_ranks(2, _on_rank, tiny_model_dir(arch, **overrides), "triton", 16)
    single, _ = runs["gqa"]
    for got, want in zip(r0["logits"], single["logits"], strict=True):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)  # kernel vs torch attention: fp32 noise
    assert r1["logits"] == [None, None]


def _copy_with(src: Path, dst: Path, **config) -> Path:
    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(cfg | config))
    return dst


@pytest.mark.parametrize(
    ("config", "size", "message"),
    [
        ({}, 3, r"num_attention_heads=4 cannot be split evenly over tensor_parallel_size=3"),
        ({"intermediate_size": 130}, 4, r"intermediate_size=130 cannot be split evenly"),
        ({"num_attention_heads": 6, "num_key_value_heads": 3, "head_dim": 16}, 2, r"num_key_value_heads=3"),
    ],
)
def test_splits_that_do_not_divide_are_refused_before_loading(
    tiny_model_dir, tmp_path, config, size, message
):
    model_dir = _copy_with(tiny_model_dir("llama"), tmp_path / "m", **config)
    # No process group needed: the check runs before any weight is read or any collective is called.
    with pytest.raises(ValueError, match=message):
        load_model(model_dir, tp=TPGroup(0, size))
