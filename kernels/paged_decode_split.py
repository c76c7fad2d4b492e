"""Split-KV decode: one query token per sequence, each sequence's visible keys cut into `num_splits` slices.

When num_seqs * num_kv_heads programs cannot fill the GPU (few sequences, long contexts), each
sequence's context is split so more programs stream K/V at once:

    partition kernel, grid (S, Hkv, num_splits):
        the sequence's visible tiles [lo, hi) (hi = cdiv(seq_len, block), lo = 0 or the window's first),
        own = cdiv(hi - lo, num_splits): split j walks [lo + j * own, min(lo + (j + 1) * own, hi))
        -> m [S, Hq, splits] (running max, log2 domain), l [S, Hq, splits] (sum of exp2),
           acc [S, Hq, splits, D] (un-normalised sum of p * v), all fp32
    reduce kernel, grid (S, Hq):
        M = max_j m_j;  w_j = exp2(m_j - M);  out = sum_j w_j acc_j / sum_j w_j l_j

The work follows each sequence's own length, read from seq_lens on the device, so a launch sized for
max_model_len (a CUDA graph's) walks only the real tiles: a 1k-token sequence in a batch captured for 32k
reads its 1k keys, not 32k masked ones. Compiled, the loop bound is that per-program count; interpreted
(LOOP_FROM_ARG), the loop runs to a host-side scalar bound with the tiles past the sequence's masked, as
paged_attention does. (Under triton 3.6's interpreter with numpy >= 2.4 every tensor loop bound fails,
scalar arguments and constexprs included: it calls int() on a 1-element array. Not solved here.)

`num_splits` is a runtime argument of both kernels, not a constexpr, and not specialised on: a new split
count compiles nothing (the reduce loads up to MAX_SPLITS partial maxima, masked, then loops over the
splits).

With a sliding window W the query (position seq_len - 1) sees keys seq_len - W .. seq_len - 1 only, so
the splits cut that range, and nothing below the window is read. Soft-capping as in paged_attention.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kernels._common import check, interpreting, next_pow2
from kernels.paged_attention import dot_settings, options, validate_attention_args, window_tiles

# Interpreted runs loop to a host-side bound (see the module docstring); tests flip it to cover both.
LOOP_BOUND_FROM_ARG = interpreting()

MIN_TOKENS_PER_SPLIT = 256  # below this a split's fixed cost (q load, partial store, reduce) dominates
MAX_SPLITS = 64
WAVES = 2  # aim for ~2 programs per SM so one slow split does not leave the GPU idle


def choose_num_splits(num_seqs: int, num_kv_heads: int, max_seq_len: int, num_sms: int) -> int:
    """1 (no split) when num_seqs * num_kv_heads programs already cover the SMs; otherwise enough
    splits for ~WAVES programs per SM, but never slices shorter than MIN_TOKENS_PER_SPLIT tokens."""
    programs = num_seqs * num_kv_heads
    if programs <= 0 or programs >= num_sms:
        return 1
    want = triton.cdiv(WAVES * num_sms, programs)
    cap = max_seq_len // MIN_TOKENS_PER_SPLIT
    return max(1, min(want, cap, MAX_SPLITS))


# Not specialised on the values that change per step (1, multiples of 16): one compile serves every split
# count, block-table width and loop bound (kernels/compile_check.py, PER_STEP_ARGS).
@triton.jit(do_not_specialize=["stride_bt", "max_tiles", "num_splits"])
def _decode_partition_kernel(
    q_ptr,  # [S, Hq, D]
    k_cache_ptr,  # [num_blocks, BLOCK_N, Hkv, D]
    v_cache_ptr,
    block_tables_ptr,  # [S, max_blocks] int32
    seq_lens_ptr,  # [S] int32
    m_ptr,  # [S, Hq, num_splits] fp32
    l_ptr,  # [S, Hq, num_splits] fp32
    acc_ptr,  # [S, Hq, num_splits, BLOCK_D] fp32, contiguous
    qk_scale,  # scale * log2(e); with SOFTCAP: scale / softcap
    softcap_log2,  # softcap * log2(e); read only with SOFTCAP
    window,  # read only with WINDOWED
    stride_qt,
    stride_qh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    head_dim,
    max_tiles,  # host-side bound on one split's tiles, used when LOOP_FROM_ARG
    num_q_heads,
    num_splits,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    LOOP_FROM_ARG: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    seq_len = tl.load(seq_lens_ptr + seq)
    seq_tiles = tl.cdiv(seq_len, BLOCK_N)
    kv_lo = 0  # oldest visible key
    if WINDOWED:
        kv_lo = tl.maximum(seq_len - window, 0)
    # This split's share of the sequence's own visible tiles [lo_tile, seq_tiles).
    lo_tile = kv_lo // BLOCK_N
    own = tl.cdiv(seq_tiles - lo_tile, num_splits)
    first = lo_tile + split * own
    end = tl.minimum(first + own, seq_tiles)
    kv_stop = tl.minimum(seq_len, end * BLOCK_N)  # keys at or past it belong to later splits

    g = tl.arange(0, BLOCK_M)  # rows: query heads of this KV head's group, padded to >= 16
    row_ok = g < GROUP
    head = kv_head * GROUP + g
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim
    q_rows = seq.to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n = tl.arange(0, BLOCK_N)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_col = kv_head.to(tl.int64) * stride_ch + n[:, None].to(tl.int64) * stride_cs + d[None, :]
    if LOOP_FROM_ARG:
        loop_end = max_tiles
    else:
        loop_end = tl.maximum(end - first, 0)
    for i in range(0, loop_end):
        tile = first + i
        block = tl.load(table + tile, mask=tile < end, other=0).to(tl.int64)
        kv_pos = tile * BLOCK_N + n
        kv_ok = (kv_pos < kv_stop) & (kv_pos >= kv_lo)
        offs = block * stride_cb + kv_col
        k = tl.load(k_cache_ptr + offs, mask=kv_ok[:, None] & d_ok[None, :], other=0.0)
        v = tl.load(v_cache_ptr + offs, mask=kv_ok[:, None] & d_ok[None, :], other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if SOFTCAP:
            s = softcap_log2 * (2.0 * tl.sigmoid(2.0 * s) - 1.0)
        s = tl.where(kv_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    part = (seq.to(tl.int64) * num_q_heads + head) * num_splits + split  # [BLOCK_M] into [S, Hq, num_splits]
    tl.store(m_ptr + part, m_i, mask=row_ok)
    tl.store(l_ptr + part, l_i, mask=row_ok)
    tl.store(acc_ptr + part[:, None] * BLOCK_D + d[None, :], acc, mask=row_ok[:, None])


@triton.jit(do_not_specialize=["num_splits"])
def _decode_reduce_kernel(
    m_ptr,  # [S, Hq, num_splits] fp32
    l_ptr,
    acc_ptr,  # [S, Hq, num_splits, BLOCK_D] fp32
    out_ptr,  # [S, Hq, D]
    stride_ot,
    stride_oh,
    num_q_heads,
    head_dim,
    num_splits,
    MAX_SPLITS_P: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    j = tl.arange(0, MAX_SPLITS_P)
    d = tl.arange(0, BLOCK_D)
    base = (seq * num_q_heads + head) * num_splits
    big_m = tl.max(tl.load(m_ptr + base + j, mask=j < num_splits, other=-1.0e30), axis=0)
    total = 0.0
    o = tl.zeros([BLOCK_D], tl.float32)
    for i in range(0, num_splits):  # a scalar argument: no bound loaded from memory
        w = tl.exp2(tl.load(m_ptr + base + i) - big_m)  # a split with no keys: m = -1e30 -> w = 0
        total += w * tl.load(l_ptr + base + i)
        o += w * tl.load(acc_ptr + (base + i) * BLOCK_D + d)
    o_ptrs = out_ptr + seq * stride_ot + head * stride_oh + d
    tl.store(o_ptrs, (o / total).to(out_ptr.dtype.element_ty), mask=d < head_dim)


def paged_decode_split(
    query: torch.Tensor,  # [S, Hq, D], one token per sequence
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,  # [S, max_blocks] int32
    seq_lens: torch.Tensor,  # [S] int32
    max_seq_len: int,
    scale: float,
    num_splits: int,
    out: torch.Tensor | None = None,
    *,
    window: int | None = None,  # sliding window (keys p - window < j <= p); None: full causal
    softcap: float | None = None,  # logits -> softcap * tanh(logits / softcap); None: off
) -> torch.Tensor:
    out = validate_attention_args(query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, out)
    qk_scale, softcap_log2, window_arg = options(scale, window, softcap)
    num_seqs = seq_lens.shape[0]
    check(
        query.shape[0] == num_seqs,
        lambda: f"decode query must have one token per sequence: {query.shape[0]} != {num_seqs}",
    )
    check(1 <= num_splits <= MAX_SPLITS, lambda: f"num_splits must be in [1, {MAX_SPLITS}], got {num_splits}")
    block_size, num_kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2], k_cache.shape[3]
    if num_seqs == 0:
        return out
    num_q_heads = query.shape[1]
    group = num_q_heads // num_kv_heads
    block_d = max(16, next_pow2(head_dim))
    # Most tiles one split walks (the interpreted loop's bound): a sequence's visible tiles over the splits.
    max_tiles = triton.cdiv(window_tiles(window, max_seq_len, 1, block_size), num_splits)
    m = torch.empty((num_seqs, num_q_heads, num_splits), dtype=torch.float32, device=query.device)
    l_part = torch.empty_like(m)
    acc = torch.empty((num_seqs, num_q_heads, num_splits, block_d), dtype=torch.float32, device=query.device)
    dot_fp32, precision = dot_settings(query.dtype)
    _decode_partition_kernel[(num_seqs, num_kv_heads, num_splits)](
        query,
        k_cache,
        v_cache,
        block_tables,
        seq_lens,
        m,
        l_part,
        acc,
        qk_scale,
        softcap_log2,
        window_arg,
        query.stride(0),
        query.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        head_dim,
        max_tiles,
        num_q_heads,
        num_splits,
        GROUP=group,
        BLOCK_M=max(16, next_pow2(group)),
        BLOCK_N=block_size,
        BLOCK_D=block_d,
        DOT_FP32=dot_fp32,
        PRECISION=precision,
        LOOP_FROM_ARG=LOOP_BOUND_FROM_ARG,
        WINDOWED=window is not None,
        SOFTCAP=softcap is not None,
        # The per-sequence bounds keep a few more values live: the bf16 32 x 128 K/V tile spilled 20 B at
        # 4 warps on sm_90 (kernels/compile_check.py); 8 warps spread them over twice the threads.
        num_warps=8 if block_size * block_d >= 4096 else 4,
    )
    _decode_reduce_kernel[(num_seqs, num_q_heads)](
        m,
        l_part,
        acc,
        out,
        out.stride(0),
        out.stride(1),
        num_q_heads,
        head_dim,
        num_splits,
        MAX_SPLITS_P=next_pow2(MAX_SPLITS),
        BLOCK_D=block_d,
    )
    return out
