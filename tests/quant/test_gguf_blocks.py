"""GGUF Q4_0/Q4_1/Q8_0 blocks as kernel inputs: the packed weights read back exactly what
`gguf.quants.dequantize` gives, on synthetic blocks and on the real SmolLM2 file's tensors."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.quant.gguf_blocks import q4_to_int4, q8_0_per_channel, q8_0_to_int8
from engine.quant.int4 import Int4Weight
from engine.quant.int8 import Int8Weight

T = gguf.GGMLQuantizationType
CPU = torch.device("cpu")


def _served_int4(qtype, blocks: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    """The weight [N, K] as the packed int4 op sees it: multiply by the identity (exact in float32)."""
    layer = Int4Weight(*q4_to_int4(qtype, blocks, shape), torch.float32, CPU)
    return layer(torch.eye(shape[1])).t()


def _file_values(qtype, blocks: np.ndarray, shape: tuple[int, int]) -> torch.Tensor:
    return torch.from_numpy(np.array(gguf.quants.dequantize(blocks, qtype)).reshape(shape))


def _blocks(qtype, n: int, k: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n, k)).astype(np.float32) * rng.uniform(1e-3, 10, (n, 1)).astype(np.float32)
    return gguf.quants.quantize(w, qtype)


@pytest.mark.parametrize("qtype", [T.Q4_0, T.Q4_1])
def test_synthetic_int4_blocks_are_served_exactly(qtype):
    blocks = _blocks(qtype, 32, 128, seed=int(qtype))
    assert torch.equal(_served_int4(qtype, blocks, (32, 128)), _file_values(qtype, blocks, (32, 128)))


def test_hand_made_q4_1_block_layout():
    # One row, one block: d = 0.5, m = -2, codes 0..15 then 15..0 (low nibbles are weights 0..15).
    codes = np.array(list(range(16)) + list(range(15, -1, -1)), dtype=np.uint8)
    head = np.array([0.5, -2.0], dtype=np.float16).view(np.uint8)
    block = np.concatenate([head, codes[:16] | (codes[16:] << 4)])[None, :]
    c, scale, zero = q4_to_int4("Q4_1", block, (1, 32))
    assert c[0].tolist() == codes.tolist()
    assert scale.item() == 0.5 and zero.item() == -2.0 + 8 * 0.5
    assert torch.equal(
        torch.from_numpy(gguf.quants.dequantize(block, T.Q4_1)).reshape(1, 32)[0],
        0.5 * torch.from_numpy(codes).float() - 2,
    )


def test_q8_0_blocks_read_back_and_per_channel_only_when_exact():
    blocks = _blocks(T.Q8_0, 16, 64, seed=3)
    q, d = q8_0_to_int8(blocks, (16, 64))
    want = _file_values(T.Q8_0, blocks, (16, 64))
    assert torch.equal(q.float() * d.repeat_interleave(32, 1), want)
    assert q8_0_per_channel(d) is None  # random rows: their two blocks have different scales
    # Rows whose blocks share a scale are int8 per channel without a second rounding.
    same = blocks.reshape(16, 2, 34).copy()
    same[:, 1, :2] = same[:, 0, :2]
    same = same.reshape(16, 68)
    q, d = q8_0_to_int8(same, (16, 64))
    scale = q8_0_per_channel(d)
    assert scale is not None
    read = Int8Weight(q, scale, torch.float32, CPU)(torch.eye(64)).t()
    assert torch.equal(read, _file_values(T.Q8_0, same, (16, 64)))


def test_wrong_sizes_are_refused():
    blocks = _blocks(T.Q4_1, 4, 64, seed=0)
    with pytest.raises(ValueError, match=r"Q4_1: want uint8 blocks \(4, 40\)"):
        q4_to_int4("Q4_1", blocks[:, :-1], (4, 64))
    with pytest.raises(ValueError, match="multiple of 32"):
        q4_to_int4("Q4_1", blocks, (4, 48))
    with pytest.raises(ValueError, match="not an int4 GGUF type: Q8_0"):
        q4_to_int4(T.Q8_0, blocks, (4, 64))


def test_real_smollm2_tensors_are_served_exactly():
    from tests.helpers.smollm2 import gguf_path

    reader = gguf.GGUFReader(gguf_path())
    checked: set[str] = set()
    for t in reader.tensors:
        kind = t.name.rsplit(".", 2)[-2]
        if t.tensor_type == T.Q4_1 and t.name.startswith("blk.0."):  # one layer: the float32 op is slow
            shape = (int(t.shape[1]), int(t.shape[0]))  # GGUF lists the row length first
            blocks = np.asarray(t.data).reshape(shape[0], -1)
            assert torch.equal(
                _served_int4(t.tensor_type, blocks, shape), _file_values(t.tensor_type, blocks, shape)
            ), t.name
            checked.add(kind)
        if t.name == "token_embd.weight":  # Q8_0: read back exactly; its scales vary along each row
            assert t.tensor_type == T.Q8_0
            rows = np.asarray(t.data)[:64]
            shape = (64, int(t.shape[0]))
            q, d = q8_0_to_int8(rows, shape)
            assert torch.equal(q.float() * d.repeat_interleave(32, 1), _file_values(T.Q8_0, rows, shape))
            assert q8_0_per_channel(d) is None
            checked.add("token_embd")
    assert checked == {
        "attn_q",
        "attn_k",
        "attn_v",
        "attn_output",
        "ffn_gate",
        "ffn_up",
        "ffn_down",
        "token_embd",
    }
