"""One-launch causal attention over a paged KV cache for a mixed batch (prefill chunks + decodes).

Grid: (num_seqs, cdiv(max_query_len, BLOCK_Q), num_kv_heads). A program takes BLOCK_Q query tokens
of one sequence and all GROUP query heads that share one KV head, packed as BLOCK_M = BLOCK_Q * GROUP_P
rows (GROUP_P = GROUP rounded up to a power of two), so each K/V tile is read once per group:

    row m  ->  query token  q0 + m // GROUP_P,  query head  kv_head * GROUP + m % GROUP_P

It walks the sequence's block table one cache block (BLOCK_N = block_size positions) at a time with an
online softmax in fp32. Query token i of sequence s sits at position seq_len - q_len + i and sees keys
0 .. that position. Programs whose q block is past the sequence's q_len exit at once.

Options (per launch, so per layer):
- `window` W: a query at position p sees only keys p - W < j <= p (transformers' `sliding_window`). The
  walk starts at the tile holding the oldest key the q block's first query still sees, so tiles wholly
  below every row's window are never loaded: a windowed program reads at most
  cdiv(W + BLOCK_Q - 1, BLOCK_N) + 1 tiles, whatever the context length.
- `softcap` c: logits x = q.k * scale become c * tanh(x / c) before the softmax (Gemma 2). tanh is
  written as 2 * sigmoid(2x) - 1, which every Triton backend (and the interpreter) has.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kernels._common import check, check_cache, interpreting, next_pow2
from kernels.block_sizes import TRITON_BLOCK_SIZES

LOG2E = 1.4426950408889634
# Loop to a host-side bound with masked tiles when interpreting: triton 3.6 + numpy 2.4 cannot run an
# interpreted loop whose bound was loaded from memory (triton#9171). Tests flip it to cover both paths.
LOOP_BOUND_FROM_ARG = interpreting()


# Not specialised on the values that change per step (the block table's width, the interpreted loop's
# bound): one compile serves every step (kernels/compile_check.py, PER_STEP_ARGS).
@triton.jit(do_not_specialize=["stride_bt", "max_tiles"])
def _paged_attention_kernel(
    q_ptr,  # [T, Hq, D]
    k_cache_ptr,  # [num_blocks, BLOCK_N, Hkv, D]
    v_cache_ptr,  # [num_blocks, BLOCK_N, Hkv, D]
    out_ptr,  # [T, Hq, D]
    block_tables_ptr,  # [S, max_blocks] int32
    seq_lens_ptr,  # [S] int32
    query_start_loc_ptr,  # [S + 1] int32
    qk_scale,  # scale * log2(e) (scores go through exp2); with SOFTCAP: scale / softcap
    softcap_log2,  # softcap * log2(e); read only with SOFTCAP
    window,  # sliding window W; read only with WINDOWED
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_bt,
    head_dim,
    max_tiles,  # host-side bound on the tiles one program walks, used when LOOP_FROM_ARG
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    DOT_FP32: tl.constexpr,
    PRECISION: tl.constexpr,
    LOOP_FROM_ARG: tl.constexpr,
    WINDOWED: tl.constexpr,
    SOFTCAP: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P
    seq = tl.program_id(0)
    q_block = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(query_start_loc_ptr + seq)
    q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
    if q_block * BLOCK_Q >= q_len:
        return
    seq_len = tl.load(seq_lens_ptr + seq)
    prefix = seq_len - q_len

    m = tl.arange(0, BLOCK_M)
    tok = q_block * BLOCK_Q + m // GROUP_P  # [BLOCK_M] token index inside this sequence's chunk
    g = m % GROUP_P
    row_ok = (tok < q_len) & (g < GROUP)
    head = kv_head * GROUP + g
    d = tl.arange(0, BLOCK_D)
    d_ok = d < head_dim

    q_rows = (q_start + tok).to(tl.int64) * stride_qt + head.to(tl.int64) * stride_qh  # [BLOCK_M]
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
    if DOT_FP32:
        q = q.to(tl.float32)
    q_pos = prefix + tok  # [BLOCK_M] absolute position of each row's query token

    # Keys this q block can see: up to the position of its last query token.
    kv_end = prefix + tl.minimum(q_len, (q_block + 1) * BLOCK_Q)
    num_tiles = tl.cdiv(kv_end, BLOCK_N)
    first_tile = 0
    if WINDOWED:  # oldest key the q block's first query sees; every later row sees only newer keys
        first_tile = tl.maximum(prefix + q_block * BLOCK_Q - window + 1, 0) // BLOCK_N

    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: fully masked rows give p = 0, not NaN
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    n = tl.arange(0, BLOCK_N)
    table = block_tables_ptr + seq.to(tl.int64) * stride_bt
    kv_col = kv_head.to(tl.int64) * stride_ch + n[:, None].to(tl.int64) * stride_cs + d[None, :]  # [N, D]
    # Compiled: from first_tile to this q block's last tile. Interpreted: scalar trip count, extra tiles
    # masked (their block id loads as 0 and every key is masked out).
    if LOOP_FROM_ARG:
        loop_end = max_tiles
    else:
        loop_end = num_tiles - first_tile
    for i in range(0, loop_end):
        tile = first_tile + i
        block = tl.load(table + tile, mask=tile < num_tiles, other=0).to(tl.int64)
        kv_pos = tile * BLOCK_N + n  # [BLOCK_N]
        kv_mask = (kv_pos < kv_end)[:, None] & d_ok[None, :]
        offs = block * stride_cb + kv_col
        k = tl.load(k_cache_ptr + offs, mask=kv_mask, other=0.0)  # [BLOCK_N, BLOCK_D]
        v = tl.load(v_cache_ptr + offs, mask=kv_mask, other=0.0)
        if DOT_FP32:
            k = k.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale  # [BLOCK_M, BLOCK_N]
        if SOFTCAP:  # s was logits / softcap: c * tanh(s), in the log2 domain
            s = softcap_log2 * (2.0 * tl.sigmoid(2.0 * s) - 1.0)
        visible = kv_pos[None, :] <= q_pos[:, None]
        if WINDOWED:
            visible = visible & (q_pos[:, None] - kv_pos[None, :] < window)
        s = tl.where(visible, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        p = tl.exp2(s - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    acc = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (q_start + tok).to(tl.int64) * stride_ot + head.to(tl.int64) * stride_oh
    tl.store(
        out_ptr + o_rows[:, None] + d[None, :],
        acc.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & d_ok[None, :],
    )


def validate_attention_args(
    query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, out
) -> torch.Tensor:
    """Check every argument shared by the paged attention launchers; return `out`, allocated if None."""
    check_cache("k_cache", k_cache)
    check_cache("v_cache", v_cache)
    check(
        k_cache.shape == v_cache.shape,
        lambda: f"k_cache {tuple(k_cache.shape)} != v_cache {tuple(v_cache.shape)}",
    )
    check(k_cache.stride() == v_cache.stride(), "k_cache and v_cache must have the same strides")
    check(
        query.dim() == 3,
        lambda: f"query must be [num_tokens, num_q_heads, head_dim], got {tuple(query.shape)}",
    )
    check(query.stride(2) == 1, "query head_dim must be contiguous")
    check(query.dtype == k_cache.dtype, lambda: f"query dtype {query.dtype} != cache dtype {k_cache.dtype}")
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    check(query.shape[2] == head_dim, lambda: f"query head_dim {query.shape[2]} != cache head_dim {head_dim}")
    check(
        query.shape[1] % num_kv_heads == 0,
        lambda: f"num_q_heads {query.shape[1]} must be a multiple of num_kv_heads {num_kv_heads}",
    )
    check(
        block_tables.dtype == torch.int32 and block_tables.dim() == 2,
        "block_tables must be int32 [S, max_blocks]",
    )
    check(block_tables.stride(1) == 1, "block_tables rows must be contiguous")
    check(seq_lens.dtype == torch.int32 and seq_lens.dim() == 1, "seq_lens must be int32 [S]")
    check(block_tables.shape[0] == seq_lens.shape[0], "block_tables and seq_lens disagree on num_seqs")
    # The engine's sizes are TRITON_BLOCK_SIZES (EngineConfig refuses others); the kernels compile for any
    # power of two from the smallest of them (kernels/compile_check.py probes larger ones).
    block_size = k_cache.shape[1]
    check(
        block_size >= TRITON_BLOCK_SIZES[0] and block_size == next_pow2(block_size),
        lambda: (
            f"block_size must be one of {TRITON_BLOCK_SIZES} (or a larger power of two), got {block_size}"
        ),
    )
    devices = {t.device for t in (query, k_cache, v_cache, block_tables, seq_lens)}
    check(len(devices) == 1, lambda: f"all tensors must be on one device, got {devices}")
    block_size = k_cache.shape[1]
    check(
        block_tables.shape[1] * block_size >= max_seq_len,
        lambda: (
            f"block_tables width {block_tables.shape[1]} x block_size {block_size} < max_seq_len {max_seq_len}"
        ),
    )
    if out is None:
        out = torch.empty_like(query)
    check(
        out.shape == query.shape and out.dtype == query.dtype and out.stride(2) == 1, "out must match query"
    )
    return out


def options(scale: float, window: int | None, softcap: float | None) -> tuple[float, float, int]:
    """Validate the window/softcap options; return the kernels' (qk_scale, softcap_log2, window) args."""
    check(
        window is None or (isinstance(window, int) and not isinstance(window, bool) and window >= 1),
        lambda: f"window must be None or an int >= 1, got {window!r}",
    )
    check(softcap is None or softcap > 0, lambda: f"softcap must be None or > 0, got {softcap!r}")
    if softcap is None:
        return scale * LOG2E, 0.0, window or 0
    return scale / softcap, softcap * LOG2E, window or 0


def window_tiles(window: int | None, max_seq_len: int, span: int, block_size: int) -> int:
    """Most cache tiles one program walks when its `span` consecutive queries see `window` keys each."""
    all_tiles = triton.cdiv(max_seq_len, block_size)
    if window is None:
        return all_tiles
    # window + span - 1 consecutive keys, starting anywhere inside a tile: one more tile than aligned
    return min(all_tiles, triton.cdiv(window + span - 1, block_size) + 1)


def dot_settings(dtype: torch.dtype) -> tuple[bool, str]:
    """(upcast to fp32 before tl.dot, input_precision): the interpreter's fp16/bf16 dot is broken, and
    fp32 inputs would silently run as tf32 on GPUs."""
    if interpreting():
        return dtype != torch.float32, "ieee"
    return False, "ieee" if dtype == torch.float32 else "tf32"


def paged_attention(
    query: torch.Tensor,  # [T, Hq, D]
    k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
    block_tables: torch.Tensor,  # [S, max_blocks] int32
    seq_lens: torch.Tensor,  # [S] int32, context length after this step
    query_start_loc: torch.Tensor,  # [S + 1] int32
    max_query_len: int,
    max_seq_len: int,
    scale: float,
    out: torch.Tensor | None = None,  # [T, Hq, D], dtype of query
    *,
    window: int | None = None,  # sliding window (keys p - window < j <= p); None: full causal
    softcap: float | None = None,  # logits -> softcap * tanh(logits / softcap); None: off
) -> torch.Tensor:
    out = validate_attention_args(query, k_cache, v_cache, block_tables, seq_lens, max_seq_len, out)
    qk_scale, softcap_log2, window_arg = options(scale, window, softcap)
    num_seqs = seq_lens.shape[0]
    check(
        query_start_loc.dtype == torch.int32 and query_start_loc.shape == (num_seqs + 1,),
        lambda: f"query_start_loc must be int32 [{num_seqs + 1}]",
    )
    block_size = k_cache.shape[1]
    if num_seqs == 0 or max_query_len == 0:
        return out
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    group = query.shape[1] // num_kv_heads
    group_p = next_pow2(group)
    # tl.dot needs BLOCK_M >= 16; prefill gets taller tiles to reuse each K/V tile across more queries.
    target_m = 16 if max_query_len == 1 else 64
    block_q = max(1, min(next_pow2(max_query_len), target_m // group_p))
    if block_q * group_p < 16:
        block_q = 16 // group_p
    dot_fp32, precision = dot_settings(query.dtype)
    block_d = max(16, next_pow2(head_dim))
    # Tall query tiles and wide K/V tiles spill registers at 4 warps on sm_80/89/90 (found by
    # kernels/compile_check.py: up to 344 B at BLOCK_M 64, block 128); 8 warps spread them over twice the threads.
    num_warps = 8 if block_q * group_p >= 64 or block_size * block_d >= 8192 else 4
    grid = (num_seqs, triton.cdiv(max_query_len, block_q), num_kv_heads)
    _paged_attention_kernel[grid](
        query,
        k_cache,
        v_cache,
        out,
        block_tables,
        seq_lens,
        query_start_loc,
        qk_scale,
        softcap_log2,
        window_arg,
        query.stride(0),
        query.stride(1),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        block_tables.stride(0),
        head_dim,
        window_tiles(window, max_seq_len, block_q, block_size),
        GROUP=group,
        GROUP_P=group_p,
        BLOCK_Q=block_q,
        BLOCK_N=block_size,
        BLOCK_D=block_d,
        DOT_FP32=dot_fp32,
        PRECISION=precision,
        LOOP_FROM_ARG=LOOP_BOUND_FROM_ARG,
        WINDOWED=window is not None,
        SOFTCAP=softcap is not None,
        num_warps=num_warps,
    )
    return out


def paged_attention_ref(
    query,
    k_cache,
    v_cache,
    block_tables,
    seq_lens,
    query_start_loc,
    max_query_len,
    max_seq_len,
    scale,
    *,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Pure torch, one sequence at a time: gather its whole K/V from the block table, mask (causal, and
    the window), soft-cap, softmax in fp32. Deliberately skips nothing, unlike the kernels."""
    out = torch.empty_like(query)
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    group = query.shape[1] // num_kv_heads
    starts = query_start_loc.tolist()
    for s, seq_len in enumerate(seq_lens.tolist()):
        q0, q1 = starts[s], starts[s + 1]
        if q1 == q0:
            continue
        blocks = block_tables[s, : math.ceil(seq_len / block_size)].long()
        k = k_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, dim=1)  # [L, Hq, D]
        v = v_cache[blocks].flatten(0, 1)[:seq_len].float().repeat_interleave(group, dim=1)
        q = query[q0:q1].float()  # [q_len, Hq, D]
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        if softcap is not None:
            scores = softcap * torch.tanh(scores / softcap)
        q_pos = torch.arange(seq_len - (q1 - q0), seq_len, device=query.device)[:, None]
        k_pos = torch.arange(seq_len, device=query.device)[None, :]
        visible = k_pos <= q_pos
        if window is not None:
            visible &= q_pos - k_pos < window
        scores = scores.masked_fill(~visible, float("-inf"))
        out[q0:q1] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).to(query.dtype)
    return out
