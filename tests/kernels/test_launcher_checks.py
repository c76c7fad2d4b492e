"""Every launcher check still fires with its message, and no check builds its message before it fails
(a formatted message is a lambda: the launchers run these per layer, per step)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from kernels.kv_write import write_kv
from kernels.paged_attention import paged_attention
from kernels.paged_decode_split import paged_decode_split

KERNELS = Path(__file__).resolve().parents[2] / "kernels"
H, D, B = 2, 16, 16  # kv heads, head_dim, block_size


def kv_args(**over):
    a = dict(
        key=torch.zeros(3, H, D),
        value=torch.zeros(3, H, D),
        k_cache=torch.zeros(4, B, H, D),
        v_cache=torch.zeros(4, B, H, D),
        slot_mapping=torch.tensor([0, 1, -1]),
    )
    a.update(over)
    return a


def attn_args(**over):
    a = dict(
        query=torch.zeros(1, 2 * H, D),
        k_cache=torch.zeros(4, B, H, D),
        v_cache=torch.zeros(4, B, H, D),
        block_tables=torch.zeros(1, 2, dtype=torch.int32),
        seq_lens=torch.tensor([5], dtype=torch.int32),
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        max_query_len=1,
        max_seq_len=5,
        scale=1.0,
    )
    a.update(over)
    return a


def split_args(**over):
    a = attn_args()
    del a["query_start_loc"], a["max_query_len"]
    a["num_splits"] = 2
    a.update(over)
    return a


CASES = [
    (write_kv, kv_args(k_cache=torch.zeros(4, B, H)), r"k_cache must be \[num_blocks, .*got \(4, 16, 2\)"),
    (write_kv, kv_args(v_cache=torch.zeros(4, B, H, D, dtype=torch.int32)), r"v_cache dtype must be .*int32"),
    (
        write_kv,
        kv_args(k_cache=torch.zeros(4, B, D, H).transpose(2, 3)),
        r"last dim .* strides \(512, 32, 1, 2\)",
    ),
    (
        write_kv,
        kv_args(v_cache=torch.zeros(5, B, H, D)),
        r"k_cache \(4, 16, 2, 16\) != v_cache \(5, 16, 2, 16\)",
    ),
    (write_kv, kv_args(key=torch.zeros(3, H * D)), r"key must be \[num_tokens, .*got \(3, 32\)"),
    (write_kv, kv_args(value=torch.zeros(2, H, D)), r"key \(3, 2, 16\) != value \(2, 2, 16\)"),
    (
        write_kv,
        kv_args(key=torch.zeros(3, 1, D), value=torch.zeros(3, 1, D)),
        r"key heads/head_dim \(1, 16\) != cache",
    ),
    (
        write_kv,
        kv_args(key=torch.zeros(3, H, D).half()),
        r"dtypes differ: key torch.float16, value torch.float32",
    ),
    (
        write_kv,
        kv_args(slot_mapping=torch.tensor([0, 1, 2], dtype=torch.int32)),
        r"slot_mapping must be int64, got torch.int32",
    ),
    (write_kv, kv_args(slot_mapping=torch.tensor([0, 1])), r"slot_mapping must be \[3\], got \(2,\)"),
    (write_kv, kv_args(slot_mapping=torch.tensor([0, 1, -1], device="meta")), r"one device, got"),
    (paged_attention, attn_args(v_cache=torch.zeros(5, B, H, D)), r"k_cache \(4, 16, 2, 16\) != v_cache"),
    (
        paged_attention,
        attn_args(query=torch.zeros(1, 2 * H * D)),
        r"query must be \[num_tokens, .*got \(1, 64\)",
    ),
    (
        paged_attention,
        attn_args(query=torch.zeros(1, 2 * H, D).half()),
        r"query dtype torch.float16 != cache dtype",
    ),
    (
        paged_attention,
        attn_args(query=torch.zeros(1, 2 * H, 2 * D)),
        r"query head_dim 32 != cache head_dim 16",
    ),
    (
        paged_attention,
        attn_args(query=torch.zeros(1, 3, D)),
        r"num_q_heads 3 must be a multiple of num_kv_heads 2",
    ),
    (
        paged_attention,
        attn_args(k_cache=torch.zeros(4, 8, H, D), v_cache=torch.zeros(4, 8, H, D)),
        r"block_size must be one of .*got 8",
    ),
    (
        paged_attention,
        attn_args(seq_lens=torch.tensor([5], dtype=torch.int32, device="meta")),
        r"one device, got",
    ),
    (paged_attention, attn_args(max_seq_len=40), r"block_tables width 2 x block_size 16 < max_seq_len 40"),
    (
        paged_attention,
        attn_args(query_start_loc=torch.tensor([0, 1])),
        r"query_start_loc must be int32 \[2\]",
    ),
    (lambda **a: paged_attention(**a, window=0), attn_args(), r"window must be None or an int >= 1, got 0"),
    (lambda **a: paged_attention(**a, softcap=-1.0), attn_args(), r"softcap must be None or > 0, got -1.0"),
    (paged_decode_split, split_args(query=torch.zeros(2, 2 * H, D)), r"one token per sequence: 2 != 1"),
    (paged_decode_split, split_args(num_splits=65), r"num_splits must be in \[1, 64\], got 65"),
]


@pytest.mark.parametrize(("launch", "args", "message"), CASES)
def test_each_check_fires_with_its_message(launch, args, message):
    with pytest.raises(ValueError, match=message):
        launch(**args)


def test_every_formatted_message_is_built_only_on_failure():
    eager = []
    for path in sorted(KERNELS.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "check"
                and len(node.args) == 2
            ):
                if isinstance(node.args[1], ast.JoinedStr):
                    eager.append(f"{path.name}:{node.lineno}")
    assert eager == []
