"""Random paged batches for the kernel tests: scattered block ids, partial last blocks, ragged queries."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

TOLERANCE = {  # (atol, rtol) against the fp32 reference rounded to the input dtype
    torch.float32: (1e-4, 1e-4),
    torch.float16: (3e-3, 3e-3),
    torch.bfloat16: (2e-2, 2e-2),
}


@dataclass
class PagedBatch:
    query: torch.Tensor  # [T, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [S, max_blocks] int32
    seq_lens: torch.Tensor  # [S] int32
    query_start_loc: torch.Tensor  # [S + 1] int32
    slot_mapping: torch.Tensor  # [T] int64
    q_lens: list[int]
    s_lens: list[int]

    @property
    def max_query_len(self) -> int:
        return max(self.q_lens)

    @property
    def max_seq_len(self) -> int:
        return max(self.s_lens)

    def attention_args(self, scale: float) -> tuple:
        return (
            self.query,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.seq_lens,
            self.query_start_loc,
            self.max_query_len,
            self.max_seq_len,
            scale,
        )


def make_batch(
    q_lens: list[int],
    s_lens: list[int],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    num_blocks: int | None = None,
    seed: int = 0,
) -> PagedBatch:
    """Each sequence gets distinct random physical blocks from a pool with spare blocks (filled with
    random data, never referenced), so a wrong block id shows up as a mismatch."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_seq = [math.ceil(s / block_size) for s in s_lens]
    max_blocks = max(blocks_per_seq)
    num_blocks = num_blocks or 2 * sum(blocks_per_seq) + 3
    perm = torch.randperm(num_blocks, generator=gen)
    tables = torch.zeros(len(s_lens), max_blocks, dtype=torch.int32)
    used = 0
    for s, n in enumerate(blocks_per_seq):
        tables[s, :n] = perm[used : used + n].int()
        used += n
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    total = sum(q_lens)
    query = torch.randn(total, num_q_heads, head_dim, generator=gen).to(dtype)
    starts = [0]
    slots = []
    for s, (q, n) in enumerate(zip(q_lens, s_lens, strict=True)):
        starts.append(starts[-1] + q)
        for pos in range(n - q, n):
            slots.append(int(tables[s, pos // block_size]) * block_size + pos % block_size)
    return PagedBatch(
        query=query.to(DEVICE),
        k_cache=k_cache.to(DEVICE),
        v_cache=v_cache.to(DEVICE),
        block_tables=tables.to(DEVICE),
        seq_lens=torch.tensor(s_lens, dtype=torch.int32, device=DEVICE),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=DEVICE),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=DEVICE),
        q_lens=list(q_lens),
        s_lens=list(s_lens),
    )


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    atol, rtol = TOLERANCE[expected.dtype]
    torch.testing.assert_close(actual.float(), expected.float(), atol=atol, rtol=rtol)
