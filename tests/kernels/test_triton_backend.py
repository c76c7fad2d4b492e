import pytest
import torch

from engine.attention.backend import get_attention_backend
from engine.attention.metadata import AttentionMetadata
from engine.attention.triton_backend import TritonAttentionBackend
from kernels.kv_write import write_kv_ref
from kernels.paged_attention import paged_attention_ref
from tests.helpers.paged_batch import DEVICE, assert_close, make_batch

PAD = 3  # padding tokens appended after the real ones (slot -1)


def _step(q_lens, s_lens, dtype, hq=4, hkv=2, head_dim=64, block_size=16):
    """A step with PAD padding tokens, its new K/V, and the metadata the engine would build."""
    batch = make_batch(q_lens, s_lens, hq, hkv, head_dim, block_size, dtype)
    total = sum(q_lens) + PAD
    query = torch.cat([batch.query, torch.randn(PAD, hq, head_dim, device=DEVICE).to(dtype)])
    key = torch.randn(total, hkv, head_dim, device=DEVICE).to(dtype)
    value = torch.randn(total, hkv, head_dim, device=DEVICE).to(dtype)
    slots = torch.cat([batch.slot_mapping, torch.full((PAD,), -1, dtype=torch.int64, device=DEVICE)])
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        max_query_len=max(q_lens),
        max_seq_len=max(s_lens),
        is_decode_only=all(q == 1 for q in q_lens),
        query_lens_cpu=tuple(q_lens),
        seq_lens_cpu=tuple(s_lens),
    )
    return batch, query, key, value, meta


def _reference(batch, query, key, value, meta, scale):
    k_cache, v_cache = batch.k_cache.clone(), batch.v_cache.clone()
    write_kv_ref(key, value, k_cache, v_cache, meta.slot_mapping)
    real = sum(meta.query_lens_cpu)
    args = (
        meta.block_tables,
        meta.seq_lens,
        meta.query_start_loc,
        meta.max_query_len,
        meta.max_seq_len,
        scale,
    )
    return k_cache, v_cache, paged_attention_ref(query[:real], k_cache, v_cache, *args)


@pytest.mark.parametrize(
    "q_lens,s_lens,dtype,num_sms,expect_split",
    [
        ([1, 12, 4], [40, 12, 30], torch.float16, None, False),  # mixed: always the one-launch kernel
        ([1, 1, 1], [300, 17, 513], torch.bfloat16, 8, True),  # few long decodes: split
        ([1, 1, 1], [300, 17, 513], torch.float32, 2, False),  # 3 seqs x 2 kv heads >= 2 SMs: no split
    ],
)
def test_forward_matches_reference(q_lens, s_lens, dtype, num_sms, expect_split):
    backend = TritonAttentionBackend(num_sms=num_sms)
    batch, query, key, value, meta = _step(q_lens, s_lens, dtype)
    k_ref, v_ref, expected = _reference(batch, query, key, value, meta, 0.125)
    assert (backend.num_splits(meta, batch.k_cache.shape[2], query.device) > 1) == expect_split

    backend.write_kv(key, value, batch.k_cache, batch.v_cache, meta)
    assert torch.equal(batch.k_cache, k_ref) and torch.equal(batch.v_cache, v_ref)
    out = backend.forward(query, key, value, batch.k_cache, batch.v_cache, meta, 0.125)
    assert out.shape == query.shape and out.dtype == dtype
    assert_close(out[: sum(q_lens)], expected)
    assert torch.all(out[sum(q_lens) :] == 0)


def test_resolves_by_name():
    backend = get_attention_backend("triton", torch.device(DEVICE))
    assert isinstance(backend, TritonAttentionBackend) and backend.name == "triton"


def test_agrees_with_torch_backend():
    from engine.attention import torch_backend

    batch, query, key, value, meta = _step([1, 9, 1], [33, 9, 70], torch.float32)
    k2, v2 = batch.k_cache.clone(), batch.v_cache.clone()
    ours, theirs = TritonAttentionBackend(), torch_backend.TorchAttentionBackend()
    ours.write_kv(key, value, batch.k_cache, batch.v_cache, meta)
    theirs.write_kv(key, value, k2, v2, meta)
    real = sum(meta.query_lens_cpu)
    a = ours.forward(query, key, value, batch.k_cache, batch.v_cache, meta, 0.125)[:real]
    b = theirs.forward(query, key, value, k2, v2, meta, 0.125)[:real]
    assert_close(a, b)


def test_sm_count_is_looked_up_once_per_device(monkeypatch):
    """num_splits runs per layer per step: the device's SM count is read once, not on every call."""
    from engine.attention import triton_backend

    lookups: list[torch.device] = []
    monkeypatch.setattr(triton_backend, "_num_sms", lambda device: lookups.append(device) or 8)
    _, _, _, _, meta = _step([1, 1], [40, 70], torch.float32)
    backend = TritonAttentionBackend()
    for _ in range(3):
        backend.num_splits(meta, 2, torch.device("cpu"))
    assert lookups == [torch.device("cpu")]
