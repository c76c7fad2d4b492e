"""Pure-torch paged attention: the CPU path, and the reference the Triton kernels are compared to.

Attention runs one sequence at a time. Gathering every decode row's keys into one padded [B, L_max] batch
looked cheaper (one call per layer) but measured several times slower at 64 sequences: the padded copy
(~180 MB) cannot stay in the CPU caches, while one sequence's keys (a few MB at most) are still there when
the attention right after the gather reads them.

Per sequence and layer: a gather of its KV blocks (index_select over whole blocks), then one SDPA call.
A prefill chunk with no cached context reads this step's K/V rows directly and gathers nothing. A decode
row needs no repeat for GQA: the G query heads sharing a KV head are laid out as G "query positions" of
that head, q: [kv_heads, G, D], exact because a decode query sees every cached key. A chunk after cached
context uses a causal mask offset by the context length. What depends only on the step (row ranges,
block lists, masks) is planned once, on the first layer's call, and reused by every layer.

A sliding window (a query at position i sees keys i - window < j <= i) is planned once per window size
per step: each sequence reads only the blocks from the one holding its first query's oldest visible key,
and a mask drops the keys below each row's window. A decode row's visible keys are then a plain slice, so
it keeps the mask-free SDPA call. Soft-capping (softcap * tanh(logits / softcap)) has no SDPA form: those
layers run the softmax explicitly, in fp32.

Per-call work. Each torch call costs microseconds of dispatch and a decode step makes (sequences x layers)
of them, so the loop makes few: K and V are each one as_strided view [1, kv_heads, L, D] of their gathered
blocks (not view, slice, transpose, unsqueeze: ~36 aten calls per sequence and layer, from ~51), and
decode-only steps concatenate the SDPA outputs once. Two things that look cheaper measured slower (fp32,
one thread, a 1 GB pool, so K/V come from DRAM as in serving):
- one index_select over the layer's [2, ...] pair of the pool instead of two: slower per layer, likely
  because in one buffer V sits a multiple of 32 KiB (one block)
  after K, so SDPA's reads of a key row and its value row compete for the same L1 sets;
- no gather for a sequence whose blocks are consecutive (K and V as views of the pool): slower per
  sequence, from 2 blocks up: SDPA reads each head's rows at a stride of
  kv_heads * D, which from DRAM defeats the prefetcher, while index_select streams whole blocks and leaves
  them in L2 for SDPA to read.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.backend import check_window_softcap
from engine.attention.metadata import AttentionMetadata


@dataclass
class _Seq:
    start: int  # first row of this sequence in the flat batch
    end: int
    lo: int  # first key position read: 0, or the oldest key the first query's window still sees
    seq_len: int  # keys visible to the last row: cached context + this step's rows
    # [cdiv(seq_len, block_size) - lo // block_size] int32 block ids from the one holding key `lo`;
    # None: no cached context, keys are this step's rows start + lo .. end
    blocks: torch.Tensor | None
    skip: int  # keys to drop at the front of the gathered blocks: lo % block_size
    # [q_len, seq_len - lo] bool (True = attend); None with causal False: every key read is visible
    mask: torch.Tensor | None
    causal: bool  # a square causal chunk (no cached context, no window cut): SDPA's is_causal


@dataclass
class _StepPlan:
    meta: AttentionMetadata
    # Write path: rows of the batch with a real slot, and those slots. rows None = every row.
    write_rows: torch.Tensor | None  # [N] int64
    write_slots: torch.Tensor  # [N] int64
    num_real: int  # rows past this are padding (slot -1): zeros in the output
    block_size: int
    by_window: dict[int | None, list[_Seq]]  # filled lazily, one entry per window size used this step


def plan_step(meta: AttentionMetadata, block_size: int) -> _StepPlan:
    sm = meta.slot_mapping
    valid = sm >= 0
    if bool(valid.all()):
        rows, wslots = None, sm
    else:
        rows = valid.nonzero().squeeze(1)
        wslots = sm[rows]
    return _StepPlan(meta, rows, wslots, sum(meta.query_lens_cpu), block_size, {})


def plan_seqs(meta: AttentionMetadata, block_size: int, window: int | None) -> list[_Seq]:
    dev = meta.block_tables.device
    seqs, start = [], 0
    for s, (q, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)):
        first_pos = n - q  # position of this step's first query token
        lo = 0 if window is None else max(0, first_pos - window + 1)
        blocks, skip, mask = None, 0, None
        causal = q > 1 and lo == 0 and q == n and (window is None or window >= n)
        if q != n:
            blocks = meta.block_tables[s, lo // block_size : -(-n // block_size)]
            skip = lo % block_size
        if q > 1 and not causal:  # query i (position first_pos + i) sees key lo + c when ...
            pos = torch.arange(first_pos, n, device=dev)[:, None]
            key = torch.arange(lo, n, device=dev)[None, :]
            mask = key <= pos
            if window is not None:
                mask &= pos - key < window
        seqs.append(_Seq(start, start + q, lo, n, blocks, skip, mask, causal))
        start += q
    return seqs


def gathered_kv(s: _Seq, k_cache: torch.Tensor, v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequence s's visible cached keys and values, each [1, kv_heads, L, D] (L = seq_len - lo): one
    as_strided view of its gathered blocks, key l of head h at (skip + l) * kv_heads * D + h * D."""
    kv_heads, d = k_cache.shape[2], k_cache.shape[3]
    size, stride = (1, kv_heads, s.seq_len - s.lo, d), (kv_heads * d, d, kv_heads * d, 1)
    at = s.skip * kv_heads * d
    assert s.blocks is not None, "a sequence with cached context has its blocks planned"
    k, v = k_cache.index_select(0, s.blocks), v_cache.index_select(0, s.blocks)  # contiguous
    return k.as_strided(size, stride, at), v.as_strided(size, stride, at)


def _softcapped_attention(q, k, v, s: _Seq, scale: float, softcap: float) -> torch.Tensor:
    # q: [q_len, heads, D]; k/v: [kv_heads, L, D] -> [q_len, heads, D]. Explicit softmax in fp32.
    q_len, heads, d = q.shape
    kv_heads, length = k.shape[0], k.shape[1]
    qg = q.float().permute(1, 0, 2).reshape(kv_heads, heads // kv_heads, q_len, d)
    logits = torch.matmul(qg, k.float()[:, None].transpose(-1, -2)) * scale  # [kv_heads, G, q_len, L]
    logits = torch.tanh(logits / softcap) * softcap
    mask = s.mask
    if s.causal:
        mask = torch.ones(q_len, length, dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        logits = logits.masked_fill(~mask, float("-inf"))
    o = torch.matmul(logits.softmax(-1), v.float()[:, None])  # [kv_heads, G, q_len, D]
    return o.reshape(heads, q_len, d).transpose(0, 1).to(q.dtype)


class TorchAttentionBackend:
    name = "torch"

    def __init__(self) -> None:
        self._plan: _StepPlan | None = None

    def _step(self, meta: AttentionMetadata, block_size: int) -> _StepPlan:
        # Metadata objects are built fresh each step, so identity tells a new step from the next layer.
        if self._plan is None or self._plan.meta is not meta:
            self._plan = plan_step(meta, block_size)
        return self._plan

    def write_kv(self, key, value, k_cache, v_cache, meta: AttentionMetadata) -> None:
        # key/value: [T, kv_heads, D]; caches: [num_blocks, block_size, kv_heads, D] (contiguous views)
        p = self._step(meta, k_cache.shape[1])
        if p.write_rows is not None:
            key, value = key[p.write_rows], value[p.write_rows]
        kv_heads, d = k_cache.shape[2], k_cache.shape[3]
        k_cache.view(-1, kv_heads, d).index_copy_(0, p.write_slots, key.to(k_cache.dtype))
        v_cache.view(-1, kv_heads, d).index_copy_(0, p.write_slots, value.to(v_cache.dtype))

    def forward(
        self,
        query,
        key,
        value,
        k_cache,
        v_cache,
        meta: AttentionMetadata,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:
        # query: [T, heads, D]; key/value: [T, kv_heads, D] this step's rows -> [T, heads, D]
        check_window_softcap(window, softcap)
        p = self._step(meta, k_cache.shape[1])
        if window not in p.by_window:
            p.by_window[window] = plan_seqs(meta, p.block_size, window)
        t, heads, d = query.shape
        kv_heads = k_cache.shape[2]
        seqs = p.by_window[window]
        # A decode row's G query heads per KV head as G "query positions": [T, kv_heads, G, D]
        grouped = query.view(t, kv_heads, heads // kv_heads, d)
        decode_only = softcap is None and p.num_real == len(seqs)  # one row per sequence
        outs = []
        for s in seqs:
            if s.blocks is None:
                k, v = key[s.start + s.lo : s.end], value[s.start + s.lo : s.end]  # [L, kv_heads, D]
                k, v = k.transpose(0, 1)[None], v.transpose(0, 1)[None]  # [1, kv_heads, L, D]
            else:
                k, v = gathered_kv(s, k_cache, v_cache)
            if softcap is not None:
                q = query[s.start : s.end]  # [q_len, heads, D]
                outs.append(_softcapped_attention(q, k[0], v[0], s, scale, softcap))
                continue
            if s.end - s.start == 1:
                # 4-D inputs: SDPA's CPU flash kernel (3-D falls back to the slower math path)
                o = F.scaled_dot_product_attention(grouped[s.start : s.end], k, v, scale=scale)
                outs.append(o if decode_only else o.reshape(1, heads, d))  # o: [1, kv_heads, G, D]
                continue
            o = F.scaled_dot_product_attention(
                query[s.start : s.end].transpose(0, 1)[None],
                k,
                v,
                attn_mask=s.mask,
                is_causal=s.causal,
                scale=scale,
                enable_gqa=heads != kv_heads,
            )
            outs.append(o[0].transpose(0, 1))
        if decode_only:
            outs = [torch.cat(outs).view(len(seqs), heads, d)]
        if p.num_real < t:
            outs.append(query.new_zeros(t - p.num_real, heads, d))
        return torch.cat(outs) if len(outs) > 1 else outs[0].contiguous()
