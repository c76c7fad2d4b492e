"""Sliding window and logit soft-capping in the paged attention kernels, their reference, and both backends.

The reference itself is checked against transformers (its sliding-window mask function and Gemma 2's eager
attention), so "matches the reference" means "matches transformers". Windows are taken smaller than,
equal to and larger than the contexts, and on and off block boundaries (block size 16).
"""

import pytest
import torch

import kernels.paged_attention as pa
from engine.attention.metadata import AttentionMetadata
from engine.attention.torch_backend import TorchAttentionBackend
from engine.attention.triton_backend import TritonAttentionBackend
from kernels.paged_attention import paged_attention, paged_attention_ref
from kernels.paged_decode_split import paged_decode_split
from tests.helpers.paged_batch import DEVICE, assert_close, make_batch

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
BLOCK = 16

# (q_lens, seq_lens): decodes, a prefill with no cached context, chunks after cached context, a chunk
# spanning several q blocks; context lengths on (16, 32, 48, 64) and off block boundaries.
STEP = ([1, 9, 1, 20, 1], [33, 9, 64, 48, 16])
LONG_CHUNK = ([70, 1], [90, 10])


def _hf_attention(q, k, v, scale, window, softcap):
    """transformers' own math on one sequence: q [L, Hq, D], k/v [L, Hkv, D], q at positions 0 .. L-1."""
    from transformers.masking_utils import and_masks, causal_mask_function, sliding_window_overlay
    from transformers.models.gemma2.modeling_gemma2 import eager_attention_forward

    n = q.shape[0]
    fn = (
        causal_mask_function
        if window is None
        else and_masks(causal_mask_function, sliding_window_overlay(window))
    )
    idx = [torch.tensor(i) for i in range(n)]
    allowed = torch.tensor([[bool(fn(0, 0, i, j)) for j in idx] for i in idx])
    additive = torch.zeros(n, n).masked_fill(~allowed, float("-inf"))[None, None]

    class Module(torch.nn.Module):
        num_key_value_groups = q.shape[1] // k.shape[1]

    out, _ = eager_attention_forward(
        Module().eval(),
        q.transpose(0, 1)[None],
        k.transpose(0, 1)[None],
        v.transpose(0, 1)[None],
        additive,
        scaling=scale,
        softcap=softcap,
    )
    return out[0]  # [L, Hq, D]


@pytest.mark.parametrize(
    "window,softcap", [(1, None), (5, None), (16, None), (17, 3.0), (100, None), (7, 2.0)]
)
def test_reference_matches_transformers(window, softcap):
    # One 40-token sequence, the last 9 queried after 31 cached keys: the reference's positions and masks.
    batch = make_batch([9], [40], 4, 2, 32, BLOCK, F32, seed=window)
    blocks = batch.block_tables[0, :3].long()
    k = batch.k_cache[blocks].flatten(0, 1)[:40]
    v = batch.v_cache[blocks].flatten(0, 1)[:40]
    full_q = torch.randn(40, 4, 32, device=DEVICE)
    full_q[31:] = batch.query
    expected = _hf_attention(full_q, k, v, 0.3, window, softcap)[31:]
    ours = paged_attention_ref(*batch.attention_args(0.3), window=window, softcap=softcap)
    assert_close(ours, expected)


def test_window_and_softcap_change_the_result():
    # Guards the tests below against options that are silently ignored everywhere.
    batch = make_batch(*STEP, 4, 2, 64, BLOCK, F32)
    args = batch.attention_args(0.3)
    plain = paged_attention_ref(*args)
    assert not torch.allclose(plain, paged_attention_ref(*args, window=5), atol=1e-3)
    assert not torch.allclose(plain, paged_attention_ref(*args, softcap=2.0), atol=1e-3)


# Windows: 1 (itself only), < block, == block, block + 1, 2 blocks, == longest context, > every context.
CASES = [
    (F32, 4, 2, 64, STEP, 1, None),
    (F32, 4, 2, 64, STEP, 5, None),
    (F16, 8, 2, 64, STEP, 16, None),
    (BF16, 4, 1, 80, STEP, 17, 5.0),
    (F32, 4, 4, 64, STEP, 32, 2.0),
    (F32, 6, 2, 64, STEP, 64, None),
    (F16, 4, 2, 64, STEP, 1000, None),
    (F32, 4, 2, 64, LONG_CHUNK, 20, None),
    (F32, 4, 2, 64, STEP, None, 1.5),
]


@pytest.mark.parametrize("dtype,hq,hkv,head_dim,steps,window,softcap", CASES)
def test_paged_attention_matches_reference(dtype, hq, hkv, head_dim, steps, window, softcap):
    batch = make_batch(*steps, hq, hkv, head_dim, BLOCK, dtype)
    args = batch.attention_args(head_dim**-0.5)
    expected = paged_attention_ref(*args, window=window, softcap=softcap)
    assert_close(paged_attention(*args, window=window, softcap=softcap), expected)


@pytest.mark.parametrize("from_arg", [True, False])
def test_paged_attention_both_loop_bound_modes(monkeypatch, from_arg):
    monkeypatch.setattr(pa, "LOOP_BOUND_FROM_ARG", from_arg)
    batch = make_batch(*LONG_CHUNK, 4, 2, 64, BLOCK, F32)
    args = batch.attention_args(0.2)
    expected = paged_attention_ref(*args, window=23, softcap=4.0)
    assert_close(paged_attention(*args, window=23, softcap=4.0), expected)


@pytest.mark.parametrize(
    "s_lens,window,softcap,splits",
    [
        ([100, 17, 64], 16, None, 3),
        ([100, 17, 64], 33, 2.0, 2),
        ([100, 17, 64], 1, None, 4),
        ([50, 64], 64, None, 3),
        ([50, 64], 500, 3.0, 2),
        ([90, 40], None, 2.5, 3),
    ],
)
def test_split_decode_matches_reference(s_lens, window, softcap, splits):
    batch = make_batch([1] * len(s_lens), s_lens, 8, 2, 64, BLOCK, F32, seed=splits)
    args = batch.attention_args(0.125)
    out = paged_decode_split(
        batch.query,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables,
        batch.seq_lens,
        batch.max_seq_len,
        0.125,
        splits,
        window=window,
        softcap=softcap,
    )
    assert_close(out, paged_attention_ref(*args, window=window, softcap=softcap))


def _poison_below_window(batch, window: int) -> None:
    """Point every table entry whose block lies wholly below all of its sequence's windows at one
    NaN-filled block: any read of it (even one masked to -inf afterwards) turns the output into NaN."""
    used = {int(batch.block_tables[s, i]) for s, n in enumerate(batch.s_lens) for i in range(-(-n // BLOCK))}
    nan_block = max(set(range(batch.k_cache.shape[0])) - used)
    batch.k_cache[nan_block] = float("nan")
    batch.v_cache[nan_block] = float("nan")
    for s, (q, n) in enumerate(zip(batch.q_lens, batch.s_lens, strict=True)):
        oldest_seen = max(0, n - q - window + 1)
        batch.block_tables[s, : oldest_seen // BLOCK] = nan_block
    return nan_block


def test_tiles_below_the_window_are_never_read():
    q_lens, s_lens = [1, 5, 1, 40], [100, 70, 37, 90]
    batch = make_batch(q_lens, s_lens, 4, 2, 64, BLOCK, F32, num_blocks=60)
    expected = paged_attention_ref(*batch.attention_args(0.125), window=20)
    nan_block = _poison_below_window(batch, 20)
    assert int((batch.block_tables == nan_block).sum()) == 5 + 2 + 1 + 1  # whole blocks below each window
    assert_close(paged_attention(*batch.attention_args(0.125), window=20), expected)

    decode = [0, 2]  # the decode rows alone through the split kernel
    rows = torch.tensor([0, 6], device=DEVICE)  # their query rows in the flat batch
    out = paged_decode_split(
        batch.query[rows],
        batch.k_cache,
        batch.v_cache,
        batch.block_tables[decode],
        batch.seq_lens[decode],
        100,
        0.125,
        3,
        window=20,
    )
    assert_close(out, expected[rows])


def _meta(batch) -> AttentionMetadata:
    return AttentionMetadata(
        slot_mapping=batch.slot_mapping,
        query_start_loc=batch.query_start_loc,
        seq_lens=batch.seq_lens,
        block_tables=batch.block_tables,
        max_query_len=batch.max_query_len,
        max_seq_len=batch.max_seq_len,
        is_decode_only=all(q == 1 for q in batch.q_lens),
        query_lens_cpu=tuple(batch.q_lens),
        seq_lens_cpu=tuple(batch.s_lens),
    )


def _this_steps_rows(batch):
    """key/value rows for this step as the model would pass them: the rows already at their slots."""
    kv_heads, d = batch.k_cache.shape[2], batch.k_cache.shape[3]
    key = batch.k_cache.view(-1, kv_heads, d)[batch.slot_mapping]
    value = batch.v_cache.view(-1, kv_heads, d)[batch.slot_mapping]
    return key, value


@pytest.mark.parametrize("backend_cls", [TorchAttentionBackend, TritonAttentionBackend])
@pytest.mark.parametrize(
    "steps,window,softcap",
    [
        (STEP, 5, None),
        (STEP, 16, 2.0),
        (STEP, 1000, None),
        (([30, 12], [30, 12]), 7, None),  # prefills with no cached context, window < prompt
        (([1, 1, 1], [100, 17, 64]), 20, 3.0),  # decode only, short window: no split
        (([1, 1, 1], [700, 17, 600]), 520, 3.0),  # decode only, window long enough to split
    ],
)
def test_backends_match_reference(backend_cls, steps, window, softcap):
    batch = make_batch(*steps, 4, 2, 64, BLOCK, F32)
    key, value = _this_steps_rows(batch)
    meta = _meta(batch)
    expected = paged_attention_ref(*batch.attention_args(0.125), window=window, softcap=softcap)
    backend = backend_cls(num_sms=8) if backend_cls is TritonAttentionBackend else backend_cls()
    if backend_cls is TritonAttentionBackend and meta.is_decode_only:
        # The split is sized on the keys a windowed query reads, not on the context.
        assert (backend.num_splits(meta, 2, batch.query.device, window) > 1) == (window > 512)
    args = (batch.query, key, value, batch.k_cache, batch.v_cache, meta, 0.125)
    # Same step, several layers: plain, windowed, plain again (per-window plans must not leak).
    assert_close(backend.forward(*args), paged_attention_ref(*batch.attention_args(0.125)))
    assert_close(backend.forward(*args, window=window, softcap=softcap), expected)
    assert_close(backend.forward(*args), paged_attention_ref(*batch.attention_args(0.125)))


def test_torch_backend_skips_blocks_below_the_window():
    batch = make_batch([1, 5, 1, 40], [100, 70, 37, 90], 4, 2, 64, BLOCK, F32, num_blocks=60)
    key, value = _this_steps_rows(batch)
    expected = paged_attention_ref(*batch.attention_args(0.125), window=20)
    _poison_below_window(batch, 20)
    out = TorchAttentionBackend().forward(
        batch.query, key, value, batch.k_cache, batch.v_cache, _meta(batch), 0.125, window=20
    )
    assert_close(out, expected)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"window": 0}, "window"),
        ({"window": -3}, "window"),
        ({"window": True}, "window"),
        ({"window": 4.0}, "window"),
        ({"softcap": 0.0}, "softcap"),
        ({"softcap": -1.0}, "softcap"),
    ],
)
def test_bad_options_are_refused(kwargs, match):
    batch = make_batch([2, 1], [2, 9], 4, 2, 64, BLOCK, F32)
    key, value = _this_steps_rows(batch)
    with pytest.raises(ValueError, match=match):
        paged_attention(*batch.attention_args(0.125), **kwargs)
    with pytest.raises(ValueError, match=match):
        paged_decode_split(
            batch.query[:2],
            batch.k_cache,
            batch.v_cache,
            batch.block_tables,
            batch.seq_lens,
            9,
            0.1,
            1,
            **kwargs,
        )
    with pytest.raises(ValueError, match=match):
        TorchAttentionBackend().forward(
            batch.query, key, value, batch.k_cache, batch.v_cache, _meta(batch), 0.125, **kwargs
        )


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype,window,softcap", [(BF16, 4096, None), (F16, 1000, 50.0), (BF16, 37, 30.0)])
def test_real_sizes_cuda(dtype, window, softcap):
    # Compiled kernels (loop bound loaded from memory) at Mistral / Gemma 2 sizes, mixed batch and split decode.
    torch.manual_seed(0)
    q_lens = [1] * 24 + [300, 1000, 37]
    s_lens = [int(x) for x in torch.randint(1, 9000, (24,))] + [300, 6500, 1037]
    batch = make_batch(q_lens, s_lens, 32, 8, 128, BLOCK, dtype)
    args = batch.attention_args(128**-0.5)
    expected = paged_attention_ref(*args, window=window, softcap=softcap)
    assert_close(paged_attention(*args, window=window, softcap=softcap), expected)
    decode = make_batch([1, 1], [8000, 5000], 32, 8, 128, BLOCK, dtype, seed=1)
    out = paged_decode_split(
        decode.query,
        decode.k_cache,
        decode.v_cache,
        decode.block_tables,
        decode.seq_lens,
        8000,
        128**-0.5,
        4,
        window=window,
        softcap=softcap,
    )
    assert_close(out, paged_attention_ref(*decode.attention_args(128**-0.5), window=window, softcap=softcap))
