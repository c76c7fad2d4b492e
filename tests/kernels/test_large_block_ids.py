"""Block ids high enough that block_id * block_stride passes 2**31 elements.

A real cache that large is 4 GiB in fp16 even with one head of 64 and block 16 (2**21 blocks of 1024
elements). `torch.empty` on the CPU only reserves address space: pages are backed when first written,
and the Triton interpreter reads CPU tensors in place, so only the few blocks used here become
resident (~1 MiB). A kernel doing the slot math in int32 writes/reads a wrapped, wrong address and the
comparison against the reference (plain torch indexing) fails, or it faults.
"""

import pytest
import torch

from kernels.kv_write import write_kv
from kernels.paged_attention import paged_attention, paged_attention_ref
from kernels.paged_decode_split import paged_decode_split
from tests.helpers.paged_batch import DEVICE, assert_close

BLOCK, HEADS, DIM = 16, 1, 64
NUM_BLOCKS = (1 << 21) + 8  # last block's first element sits at ~2**31 + 8 * 1024


@pytest.fixture(scope="module")
def caches():
    try:
        k_cache = torch.empty(NUM_BLOCKS, BLOCK, HEADS, DIM, dtype=torch.float16, device=DEVICE)
        v_cache = torch.empty_like(k_cache)
    except (RuntimeError, MemoryError) as exc:  # overcommit disabled, or a small GPU
        pytest.skip(f"cannot reserve a 4 GiB cache: {exc}")
    return k_cache, v_cache


def test_write_then_attend_at_high_block_ids(caches):
    k_cache, v_cache = caches
    assert (NUM_BLOCKS - 1) * k_cache.stride(0) > 2**31
    table = torch.tensor([[NUM_BLOCKS - 1, 3, NUM_BLOCKS - 5]], dtype=torch.int32, device=DEVICE)
    seq_len = 40  # 2.5 blocks: partial last block at a high id
    gen = torch.Generator().manual_seed(0)
    key = torch.randn(seq_len, HEADS, DIM, generator=gen).half().to(DEVICE)
    value = torch.randn(seq_len, HEADS, DIM, generator=gen).half().to(DEVICE)
    pos = torch.arange(seq_len, device=DEVICE)
    slots = table[0, pos // BLOCK].long() * BLOCK + pos % BLOCK
    write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache[NUM_BLOCKS - 5, : seq_len - 2 * BLOCK], key[2 * BLOCK :])
    assert torch.equal(v_cache[NUM_BLOCKS - 1], value[:BLOCK])

    query = torch.randn(seq_len, 2, DIM, generator=gen).half().to(DEVICE)  # GQA 2: one prefill of 40
    seq_lens = torch.tensor([seq_len], dtype=torch.int32, device=DEVICE)
    starts = torch.tensor([0, seq_len], dtype=torch.int32, device=DEVICE)
    args = (query, k_cache, v_cache, table, seq_lens, starts, seq_len, seq_len, 0.125)
    assert_close(paged_attention(*args), paged_attention_ref(*args))

    last = query[-1:]
    decode_starts = torch.tensor([0, 1], dtype=torch.int32, device=DEVICE)
    expected = paged_attention_ref(last, k_cache, v_cache, table, seq_lens, decode_starts, 1, seq_len, 0.125)
    out = paged_decode_split(last, k_cache, v_cache, table, seq_lens, seq_len, 0.125, num_splits=2)
    assert_close(out, expected)
