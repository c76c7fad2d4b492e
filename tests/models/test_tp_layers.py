"""The tensor-parallel layers alone against their unsharded torch equivalents, on one rank and on two; each
parameter filled by its own weight loader, as the native and generic loaders fill them."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.distributed.group import TPGroup
from engine.distributed.parallel_linear import RowParallelLinear, column_linear, gate_up_linear, qkv_linear
from engine.distributed.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from engine.distributed.weight_loader import weight_loader_of
from tests.helpers.tp_values import values_on_ranks

HIDDEN, HEAD_DIM, HEADS, KV_HEADS = 6, 3, 4, 1  # one KV head for two ranks: replicated
VOCAB = 7  # not a multiple of 2: the last rank's table has one padding row
SCALE = 3.0


def _weights() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=g)

    return {
        "col.w": rand(8, HIDDEN),
        "col.b": rand(8),
        "row.w": rand(5, 8),
        "row.b": rand(5),
        "q.w": rand(HEADS * HEAD_DIM, HIDDEN),
        "k.w": rand(KV_HEADS * HEAD_DIM, HIDDEN),
        "v.w": rand(KV_HEADS * HEAD_DIM, HIDDEN),
        "q.b": rand(HEADS * HEAD_DIM),
        "k.b": rand(KV_HEADS * HEAD_DIM),
        "v.b": rand(KV_HEADS * HEAD_DIM),
        "gate.w": rand(10, HIDDEN),
        "up.w": rand(10, HIDDEN),
        "vocab.w": rand(VOCAB, HIDDEN),
        "vocab.b": rand(VOCAB),
        "x": rand(3, HIDDEN),
        "x8": rand(3, 8),
    }


def _load(param: torch.Tensor, source: torch.Tensor, shard: str | None = None) -> None:
    weight_loader_of(param)(param, source, shard)


def _build(tp: TPGroup, w: dict[str, torch.Tensor]) -> dict[str, torch.nn.Module]:
    col = column_linear(HIDDEN, 8, True, tp)
    _load(col.weight, w["col.w"])
    _load(col.bias, w["col.b"])
    row = RowParallelLinear(8, 5, True, tp)
    _load(row.weight, w["row.w"])
    _load(row.bias, w["row.b"])
    qkv = qkv_linear(HIDDEN, HEAD_DIM, HEADS, KV_HEADS, True, tp)
    for part in "qkv":
        _load(qkv.weight, w[f"{part}.w"], part)
        _load(qkv.bias, w[f"{part}.b"], part)
    gate_up = gate_up_linear(HIDDEN, 10, tp)
    _load(gate_up.weight, w["gate.w"], "gate")
    _load(gate_up.weight, w["up.w"], "up")
    embed = VocabParallelEmbedding(VOCAB, HIDDEN, tp)
    _load(embed.weight, w["vocab.w"])
    head = ParallelLMHead(VOCAB, HIDDEN, tp)
    head.weight = embed.weight  # tied, as the model ties them
    # The generic path's variants: a head with a bias (GPT-NeoX style), a scaled embedding (Gemma 3).
    biased = ParallelLMHead(VOCAB, HIDDEN, tp, bias=True)
    _load(biased.weight, w["vocab.w"])
    _load(biased.bias, w["vocab.b"])
    scaled = VocabParallelEmbedding(VOCAB, HIDDEN, tp, scale=torch.tensor(SCALE))
    _load(scaled.weight, w["vocab.w"])
    return {
        "col": col,
        "row": row,
        "qkv": qkv,
        "gate_up": gate_up,
        "embed": embed,
        "head": head,
        "biased": biased,
        "scaled": scaled,
    }


def _outputs(tp: TPGroup, w: dict[str, torch.Tensor]) -> dict[str, object]:
    layers = _build(tp, w)
    x = w["x"]
    # The row-parallel layer takes this rank's input columns, as it does after a column-parallel layer.
    x8 = w["x8"][:, layers["row"].span.start : layers["row"].span.stop]
    with torch.no_grad():
        return {
            "col": layers["col"](x),
            "row": layers["row"](x8),
            "qkv": layers["qkv"](x),
            "gate_up": layers["gate_up"](x),
            "embed": layers["embed"](torch.arange(VOCAB)),
            "head": layers["head"].gather(layers["head"](x)),
            "biased": layers["biased"].gather(layers["biased"](x)),
            "scaled": layers["scaled"](torch.arange(VOCAB)[None]),  # [1, T], as transformers calls it
            "embed_rows": layers["embed"].weight.detach().clone(),
        }


def _reference(w: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    x = w["x"]
    return {
        "col": F.linear(x, w["col.w"], w["col.b"]),
        "row": F.linear(w["x8"], w["row.w"], w["row.b"]),
        "q": F.linear(x, w["q.w"], w["q.b"]),
        "k": F.linear(x, w["k.w"], w["k.b"]),
        "v": F.linear(x, w["v.w"], w["v.b"]),
        "gate": F.linear(x, w["gate.w"]),
        "up": F.linear(x, w["up.w"]),
        "embed": F.embedding(torch.arange(VOCAB), w["vocab.w"]),
        "head": F.linear(x, w["vocab.w"]),
        "biased": F.linear(x, w["vocab.w"], w["vocab.b"]),
        "scaled": F.embedding(torch.arange(VOCAB), w["vocab.w"])[None] * SCALE,
    }


def test_one_rank_is_bitwise_the_plain_torch_layers():
    w = _weights()
    out, ref = _outputs(TPGroup.single(), w), _reference(w)
    assert torch.equal(out["col"], ref["col"]) and torch.equal(out["row"], ref["row"])
    # The fused layers against one nn.Linear over the stacked weights (what the model held before).
    qkv_w = torch.cat([w["q.w"], w["k.w"], w["v.w"]])
    qkv_b = torch.cat([w["q.b"], w["k.b"], w["v.b"]])
    assert torch.equal(out["qkv"], F.linear(w["x"], qkv_w, qkv_b))
    assert torch.equal(out["gate_up"], F.linear(w["x"], torch.cat([w["gate.w"], w["up.w"]])))
    assert torch.equal(out["embed"], ref["embed"]) and torch.equal(out["head"], ref["head"])
    assert torch.equal(out["biased"], ref["biased"]) and torch.equal(out["scaled"], ref["scaled"])


@pytest.fixture(scope="module")
def two_ranks():
    w = _weights()
    return values_on_ranks(2, _outputs, w), _reference(w)


def test_column_parallel_splits_output_columns(two_ranks):
    (r0, r1), ref = two_ranks
    torch.testing.assert_close(torch.cat([r0["col"], r1["col"]], dim=-1), ref["col"])
    g0, u0 = r0["gate_up"].chunk(2, dim=-1)
    g1, u1 = r1["gate_up"].chunk(2, dim=-1)
    torch.testing.assert_close(torch.cat([g0, g1], dim=-1), ref["gate"])
    torch.testing.assert_close(torch.cat([u0, u1], dim=-1), ref["up"])


def test_row_parallel_reduces_once_and_adds_the_bias_once(two_ranks):
    (r0, r1), ref = two_ranks
    # A bias added on each rank before the reduce would show up here as 2 * bias.
    torch.testing.assert_close(r0["row"], ref["row"])
    torch.testing.assert_close(r1["row"], ref["row"])


def test_qkv_splits_query_heads_and_replicates_the_single_kv_head(two_ranks):
    (r0, r1), ref = two_ranks
    q_local = HEADS // 2 * HEAD_DIM
    for rank, out in enumerate((r0, r1)):
        q, k, v = out["qkv"].split([q_local, HEAD_DIM, HEAD_DIM], dim=-1)
        torch.testing.assert_close(q, ref["q"][:, rank * q_local : (rank + 1) * q_local])
        torch.testing.assert_close(k, ref["k"])  # both ranks hold KV head 0
        torch.testing.assert_close(v, ref["v"])


def test_vocab_embedding_and_head_with_a_padded_vocabulary(two_ranks):
    (r0, r1), ref = two_ranks
    # Rows 0-3 on rank 0, rows 4-6 plus one zero padding row on rank 1.
    assert r0["embed_rows"].shape == r1["embed_rows"].shape == (4, HIDDEN)
    assert torch.equal(r1["embed_rows"][3], torch.zeros(HIDDEN))
    torch.testing.assert_close(r0["embed"], ref["embed"])
    torch.testing.assert_close(r1["embed"], ref["embed"])
    assert r0["head"].shape == (3, VOCAB) and r1["head"] is None  # the padding column is dropped
    torch.testing.assert_close(r0["head"], ref["head"])
    assert r0["biased"].shape == (3, VOCAB) and r1["biased"] is None  # the bias's padding row too
    torch.testing.assert_close(r0["biased"], ref["biased"])
    torch.testing.assert_close(r0["scaled"], ref["scaled"])  # scaled once, after the sum over ranks
    torch.testing.assert_close(r1["scaled"], ref["scaled"])


def test_a_checkpoint_tensor_of_the_wrong_shape_is_refused():
    col = column_linear(HIDDEN, 8, False, TPGroup.single())
    with pytest.raises(ValueError, match=r"checkpoint shape \(8, 5\) != expected \(8, 6\)"):
        _load(col.weight, torch.zeros(8, 5))
