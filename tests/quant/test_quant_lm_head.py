"""The LM head from a GGUF file's blocks on the int4 kernel (engine/quant/lm_head.py): Q8_0 as an exact pair
of int4 halves and Q4_0/Q4_1 as int4 serve exactly the file's values; a tied head gets its own kernel while
the embedding keeps its table; padding rows of a tensor-parallel rank give 0; other types stay as loaded."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.distributed.group import TPGroup
from engine.distributed.vocab_parallel import ParallelLMHead
from engine.model_loader import load_model
from engine.quant import quantize_model
from engine.quant.lm_head import DENSE_MIN_ROWS, QuantLMHead, q8_0_as_int4_pair, quant_lm_head
from tests.quant.test_quantize_model import _file_of

PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

T = gguf.GGMLQuantizationType


def _blocks(qtype, n: int, k: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    """File blocks of a random [n, k] weight and the values gguf reads back from them (float32)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(1e-3, 10, (n, 1)).astype(np.float32)
    blocks = gguf.quants.quantize(w, qtype)
    return blocks, torch.from_numpy(np.array(gguf.quants.dequantize(blocks, qtype)).reshape(n, k))


def _head(vocab: int, hidden: int, tp: TPGroup = TPGroup.single()) -> ParallelLMHead:
    head = ParallelLMHead(vocab, hidden, tp, dtype=torch.float32)
    head.weight.data.normal_()
    return head


def _served(head: QuantLMHead, hidden: int) -> torch.Tensor:
    """The [rows, hidden] weight the kernel multiplies by: its output for the identity (exact in float32)."""
    return head(torch.eye(hidden)).t()


def test_q8_0_pair_covers_every_int8_code():
    q = torch.arange(-128, 128, dtype=torch.int8).reshape(8, 32)
    d = (torch.rand(8, 1) + 0.5).half().float()  # fp16 scales, as in the file: every product exact
    codes, scale, zero = q8_0_as_int4_pair(q, d)
    assert int(codes.min()) >= 0 and int(codes.max()) <= 15
    hi, lo = (
        (codes[:, :32] - 8) * scale[:, :1] + zero[:, :1],
        (codes[:, 32:] - 8) * scale[:, 1:] + zero[:, 1:],
    )
    assert torch.equal(hi + lo, q.float() * d)


@pytest.mark.parametrize("qtype", [T.Q8_0, T.Q4_1, T.Q4_0])
def test_head_from_file_blocks_serves_the_files_values(qtype):
    blocks, want = _blocks(qtype, 64, 96, seed=int(qtype))
    new = quant_lm_head(_head(64, 96), qtype, blocks, (64, 96))
    assert isinstance(new, QuantLMHead)
    assert new.doubled == (qtype == T.Q8_0)
    assert torch.equal(_served(new, 96), want)


def test_padding_rows_of_the_last_rank_are_zero():
    # 63 rows over 2 ranks pad to 64: rank 1 holds file rows 32..62 and one row of padding.
    blocks, want = _blocks(T.Q8_0, 63, 64, seed=5)
    head = _head(63, 64, TPGroup(1, 2))
    new = quant_lm_head(head, T.Q8_0, blocks, (63, 64))
    assert isinstance(new, QuantLMHead)
    served = _served(new, 64)
    assert served.shape == (32, 64)
    assert torch.equal(served[:31], want[32:])
    assert not served[31:].any()


def test_other_types_and_wrong_shapes():
    blocks, _ = _blocks(T.Q8_0, 64, 96, seed=1)
    assert quant_lm_head(_head(64, 96), T.F16, blocks, (64, 96)) == "as loaded (F16)"
    with pytest.raises(ValueError, match="lm_head: file shape"):
        quant_lm_head(_head(64, 96), T.Q8_0, blocks, (64, 64))


@pytest.mark.parametrize("tied", [True, False])
def test_head_of_a_model_is_served_from_its_blocks(tiny_model_dir, tied):
    net, _ = load_model(tiny_model_dir("llama", tie_word_embeddings=tied), dtype=torch.float32)
    assert (net.lm_head.weight is net.embed_tokens.weight) == tied
    vocab, hidden = net.embed_tokens.weight.shape
    files = _file_of(net, dict.fromkeys(PROJECTIONS, T.Q4_1))
    emb_blocks, emb_values = _blocks(T.Q8_0, vocab, hidden, seed=2)
    # Tied: the head is read under the embedding's name; untied: under its own (the embedding's is a decoy).
    files["model.embed_tokens.weight"] = (T.Q8_0, emb_blocks, (vocab, hidden))
    if not tied:
        emb_blocks, emb_values = _blocks(T.Q8_0, vocab, hidden, seed=3)
        files["lm_head.weight"] = (T.Q8_0, emb_blocks, (vocab, hidden))
    table = net.embed_tokens.weight.detach().clone()
    summary = quantize_model(net, "int4", raw=files.__getitem__)
    kind = "int4 g32 pair (Q8_0 blocks, exact)"
    assert summary.lm_head == (f"{kind}, the table from {DENSE_MIN_ROWS} rows" if tied else kind)
    assert isinstance(net.lm_head, QuantLMHead)
    assert torch.equal(net.embed_tokens.weight, table)  # the embedding keeps its (loaded) table
    few = torch.randn(DENSE_MIN_ROWS - 1, hidden)
    torch.testing.assert_close(net.compute_logits(few), few @ emb_values.t(), rtol=1e-5, atol=1e-4)
    # From DENSE_MIN_ROWS rows a tied head multiplies by the table (here not the blocks' values, to tell
    # the two apart); an untied head has only its kernel.
    many = torch.randn(DENSE_MIN_ROWS, hidden)
    want = many @ (table if tied else emb_values).t()
    torch.testing.assert_close(net.compute_logits(many), want, rtol=1e-5, atol=1e-4)
    assert (net.lm_head.dense is not None) == tied


def test_head_stays_without_blocks_or_in_other_modes(tiny_model_dir):
    for mode, raw in (("int4", None), ("int8", "file"), ("none", "file")):
        net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
        vocab, hidden = net.embed_tokens.weight.shape
        files = _file_of(net, dict.fromkeys(PROJECTIONS, T.Q4_1))
        files["model.embed_tokens.weight"] = (
            T.Q8_0,
            _blocks(T.Q8_0, vocab, hidden, seed=2)[0],
            (vocab, hidden),
        )
        summary = quantize_model(net, mode, raw=files.__getitem__ if raw else None)
        assert summary.lm_head == "as loaded", mode
        assert isinstance(net.lm_head, ParallelLMHead), mode
