"""TorchAttentionBackend's views of the gathered K/V (as_strided, with the window's skip) and its decode-only
output path, against the pure-torch paged-attention reference: caches laid out as the pool's layer views,
as separate tensors and as non-contiguous tensors; blocks scattered, in consecutive runs, or both; with
windows and soft-capping."""

from __future__ import annotations

import pytest
import torch

from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.kv_cache import layer_views
from kernels.paged_attention import paged_attention_ref
from tests.helpers.paged_batch import assert_close, make_batch

BLOCK = 16
# (q_lens, seq_lens): decodes on and off block boundaries, a fresh prefill, chunks after cached context.
MIXED = ([1, 9, 1, 20, 1, 5], [33, 9, 64, 48, 16, 100])
DECODE = ([1, 1, 1, 1], [100, 17, 48, 3])


def _relabel(batch, runs: list[bool]):
    """The batch's blocks moved to new ids: sequence s's blocks become consecutive ids when runs[s], else
    scattered (descending, one apart). Unreferenced blocks hold noise. -> (k_cache, v_cache, tables)."""
    g = torch.Generator().manual_seed(7)
    counts = [-(-n // BLOCK) for n in batch.s_lens]
    num_blocks = 3 * sum(counts) + 4
    k = torch.randn(num_blocks, *batch.k_cache.shape[1:], generator=g)
    v = torch.randn_like(k)
    tables = torch.zeros_like(batch.block_tables)
    next_run, next_scattered = 1, num_blocks - 1
    for s, n in enumerate(counts):
        if runs[s]:
            new = list(range(next_run, next_run + n))
            next_run += n + 1  # a gap, so that two sequences' runs never touch
        else:
            new = list(range(next_scattered, next_scattered - 2 * n, -2))
            next_scattered -= 2 * n
        old = batch.block_tables[s, :n].long()
        k[new], v[new] = batch.k_cache[old], batch.v_cache[old]
        tables[s, :n] = torch.tensor(new, dtype=torch.int32)
    return k, v, tables


def _layout(k: torch.Tensor, v: torch.Tensor, how: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The same values as (k_cache, v_cache) in one of the layouts a backend may be handed."""
    if how == "pool":  # layer 1 of a 2-layer pool: V right after K, at a non-zero storage offset
        pool = torch.zeros(2, 2, *k.shape, dtype=k.dtype)
        pool[1, 0], pool[1, 1] = k, v
        return layer_views(pool)[1]
    if how == "separate":
        return k.clone(), v.clone()
    # "strided": every cache row padded to twice the head size, so neither cache is contiguous
    wide_k, wide_v = (torch.zeros(*k.shape[:-1], 2 * k.shape[-1], dtype=k.dtype) for _ in range(2))
    wide_k[..., : k.shape[-1]], wide_v[..., : k.shape[-1]] = k, v
    return wide_k[..., : k.shape[-1]], wide_v[..., : k.shape[-1]]


def _meta(batch, tables) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=batch.slot_mapping,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=tables,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        is_decode_only=all(q == 1 for q in batch.q_lens),
        query_lens_cpu=tuple(batch.q_lens),
        seq_lens_cpu=tuple(batch.s_lens),
    )


@pytest.mark.parametrize("layout", ["pool", "separate", "strided"])
@pytest.mark.parametrize("runs", ["all", "none", "alternate"])
@pytest.mark.parametrize("steps", [MIXED, DECODE], ids=["mixed", "decode"])
def test_every_cache_view_matches_the_reference(layout, runs, steps):
    batch = make_batch(*steps, 4, 2, 64, BLOCK, torch.float32)
    n = len(batch.s_lens)
    k, v, tables = _relabel(batch, [runs == "all" or (runs == "alternate" and s % 2 == 0) for s in range(n)])
    k_cache, v_cache = _layout(k, v, layout)
    meta = _meta(batch, tables)
    # This step's rows as the model passes them (read from where write_kv put them before the relabelling).
    key = batch.k_cache.view(-1, *k.shape[2:])[batch.slot_mapping]
    value = batch.v_cache.view(-1, *v.shape[2:])[batch.slot_mapping]
    backend = TorchAttentionBackend()
    args = (batch.query, key, value, k_cache, v_cache, meta, 0.125)
    # Same step, several layers: plain, windowed (skip inside the first block read), soft-capped.
    assert_close(backend.forward(*args), paged_attention_ref(*batch.attention_args(0.125)))
    for window, softcap in [(20, None), (None, 3.0), (37, 2.0)]:
        expected = paged_attention_ref(*batch.attention_args(0.125), window=window, softcap=softcap)
        assert_close(backend.forward(*args, window=window, softcap=softcap), expected)
