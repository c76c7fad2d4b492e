"""TorchAttentionBackend against a naive per-token reference: mixed batches, GQA ratios, padding slots."""

from __future__ import annotations

import pytest
import torch

from engine.attention.backend import get_attention_backend
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from tests.helpers.model_helpers import metadata


def naive(q, k_cache, v_cache, meta: AttentionMetadata, scale: float, block_size: int) -> torch.Tensor:
    """One token at a time: gather its visible keys by hand, softmax in float64."""
    out = torch.zeros_like(q)
    group = q.shape[1] // k_cache.shape[2]
    starts = meta.query_start_loc.tolist()
    for s, n in enumerate(meta.seq_lens_cpu):
        table = meta.block_tables[s].tolist()
        for i in range(starts[s], starts[s + 1]):
            visible = n - (starts[s + 1] - i) + 1
            slots = [(table[p // block_size], p % block_size) for p in range(visible)]
            k = torch.stack([k_cache[b, o] for b, o in slots]).double()  # [L, kv_heads, D]
            v = torch.stack([v_cache[b, o] for b, o in slots]).double()
            k, v = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
            w = torch.softmax(torch.einsum("hd,lhd->hl", q[i].double(), k) * scale, -1)
            out[i] = torch.einsum("hl,lhd->hd", w, v).to(q.dtype)
    return out


@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (4, 2), (8, 2), (4, 1)])
@pytest.mark.parametrize("block_size", [4, 16])
def test_mixed_batch_matches_naive(heads, kv_heads, block_size):
    g = torch.Generator().manual_seed(0)
    d, num_blocks = 16, 40
    kc = torch.zeros(num_blocks, block_size, kv_heads, d)
    vc = torch.zeros_like(kc)
    perm = torch.randperm(num_blocks, generator=g).tolist()
    # (start_pos, new tokens, blocks): fresh prefill, chunk after cached context, two decodes.
    lens = [(0, 9), (5, 7), (20, 1), (3, 1)]
    chunks, used = [], 0
    for start, n in lens:
        need = -(-(start + n) // block_size)
        chunks.append((start, n, perm[used : used + need]))
        used += need
    # Cached context (positions before start) is written first, as earlier steps would have.
    backend = TorchAttentionBackend()
    ctx = metadata([(0, s, b) for s, _, b in chunks if s > 0], block_size)
    t_ctx = int(ctx.query_start_loc[-1])
    backend.write_kv(
        torch.randn(t_ctx, kv_heads, d, generator=g),
        torch.randn(t_ctx, kv_heads, d, generator=g),
        kc,
        vc,
        ctx,
    )
    meta = metadata(chunks, block_size)
    t = int(meta.query_start_loc[-1])
    q, k, v = (torch.randn(t, h, d, generator=g) for h in (heads, kv_heads, kv_heads))
    backend.write_kv(k, v, kc, vc, meta)
    got = backend.forward(q, k, v, kc, vc, meta, 0.25)
    torch.testing.assert_close(got, naive(q, kc, vc, meta, 0.25, block_size), atol=1e-5, rtol=1e-5)


def test_decode_only_and_padding_rows_skipped():
    g = torch.Generator().manual_seed(1)
    kc = torch.zeros(8, 4, 2, 8)
    vc = torch.zeros_like(kc)
    backend = get_attention_backend("torch", torch.device("cpu"))
    base = metadata([(0, 6, [3, 5]), (0, 3, [7])], 4)
    backend.write_kv(torch.randn(9, 2, 8, generator=g), torch.randn(9, 2, 8, generator=g), kc, vc, base)
    meta = metadata([(6, 1, [3, 5]), (3, 1, [7])], 4)
    # Two padding rows (slot -1) after the real tokens, as a fixed-size (graph) batch would have.
    padded = AttentionMetadata(
        torch.cat([meta.slot_mapping, torch.tensor([-1, -1])]),
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables,
        1,
        7,
        True,
        meta.query_lens_cpu,
        meta.seq_lens_cpu,
    )
    before = kc.clone()
    k = torch.randn(4, 2, 8, generator=g)
    v = torch.randn(4, 2, 8, generator=g)
    backend.write_kv(k, v, kc, vc, padded)
    changed = (kc != before).any(-1).any(-1).nonzero().tolist()
    assert changed == [[5, 2], [7, 3]]  # only the two real slots were written
    q = torch.randn(4, 4, 8, generator=g)
    got = backend.forward(q, k, v, kc, vc, padded, 0.3)
    torch.testing.assert_close(got[:2], naive(q[:2], kc, vc, meta, 0.3, 4), atol=1e-5, rtol=1e-5)
    assert got.shape == (4, 4, 8)


def test_bfloat16_close_to_float32():
    g = torch.Generator().manual_seed(2)
    kc = torch.zeros(6, 4, 2, 16)
    vc = torch.zeros_like(kc)
    meta = metadata([(0, 10, [4, 1, 2]), (0, 1, [5])], 4)
    q, k, v = (
        torch.randn(11, 4, 16, generator=g),
        torch.randn(11, 2, 16, generator=g),
        torch.randn(11, 2, 16, generator=g),
    )
    ref_backend, bf_backend = TorchAttentionBackend(), TorchAttentionBackend()
    ref_backend.write_kv(k, v, kc, vc, meta)
    ref = ref_backend.forward(q, k, v, kc, vc, meta, 0.25)
    kb, vb = torch.zeros_like(kc, dtype=torch.bfloat16), torch.zeros_like(vc, dtype=torch.bfloat16)
    bf_backend.write_kv(k.bfloat16(), v.bfloat16(), kb, vb, meta)
    got = bf_backend.forward(q.bfloat16(), k.bfloat16(), v.bfloat16(), kb, vb, meta, 0.25)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), ref, atol=3e-2, rtol=3e-2)
