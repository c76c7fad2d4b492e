"""Pure-torch paged attention: the CPU path, and the reference the Triton kernels are compared to.

Attention runs one sequence at a time. Gathering every decode row's keys into one padded [B, L_max] batch
looked cheaper (one call per layer) but measured 6x slower on a 2-core CPU at 64 sequences (52.6 vs 8.4
ms per layer in fp32, benchmarks/cpu_decode_attention.py): the padded copy (~180 MB) cannot stay in the CPU caches, while one sequence's keys (a few MB
at most) are still there when the attention right after the gather reads them.

Per sequence and layer: a gather of its KV blocks (index_select over whole blocks), then one SDPA call.
A prefill chunk with no cached context reads this step's K/V rows directly and gathers nothing. A decode
row needs no repeat for GQA: the G query heads sharing a KV head are laid out as G "query positions" of
that head, q: [kv_heads, G, D], exact because a decode query sees every cached key. A chunk after cached
context uses a causal mask offset by the context length. What depends only on the step (row ranges,
block lists, masks) is planned once, on the first layer's call, and reused by every layer.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.attention.metadata import AttentionMetadata


@dataclass
class _Seq:
    start: int  # first row of this sequence in the flat batch
    end: int
    seq_len: int  # keys visible to the last row: cached context + this step's rows
    blocks: torch.Tensor | None  # [ceil(seq_len / block_size)] int32 block ids; None: no cached context
    mask: torch.Tensor | None  # [q_len, seq_len] bool (True = attend) for a chunk after cached context


@dataclass
class _StepPlan:
    meta: AttentionMetadata
    # Write path: rows of the batch with a real slot, and those slots. rows None = every row.
    write_rows: torch.Tensor | None  # [N] int64
    write_slots: torch.Tensor  # [N] int64
    seqs: list[_Seq]
    num_real: int  # rows past this are padding (slot -1): zeros in the output


def plan_step(meta: AttentionMetadata, block_size: int) -> _StepPlan:
    dev = meta.block_tables.device
    sm = meta.slot_mapping
    valid = sm >= 0
    if bool(valid.all()):
        rows, wslots = None, sm
    else:
        rows = valid.nonzero().squeeze(1)
        wslots = sm[rows]

    seqs, start = [], 0
    for s, (q, n) in enumerate(zip(meta.query_lens_cpu, meta.seq_lens_cpu, strict=True)):
        blocks = mask = None
        if q != n:
            blocks = meta.block_tables[s, : -(-n // block_size)]
            if q > 1:  # query i sees keys 0 .. n - q + i
                mask = torch.arange(q, device=dev)[:, None] + (n - q) >= torch.arange(n, device=dev)[None, :]
        seqs.append(_Seq(start, start + q, n, blocks, mask))
        start += q
    return _StepPlan(meta, rows, wslots, seqs, start)


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
        self, query, key, value, k_cache, v_cache, meta: AttentionMetadata, scale: float
    ) -> torch.Tensor:
        # query: [T, heads, D]; key/value: [T, kv_heads, D] this step's rows -> [T, heads, D]
        p = self._step(meta, k_cache.shape[1])
        t, heads, d = query.shape
        kv_heads = k_cache.shape[2]
        outs = []
        for s in p.seqs:
            if s.blocks is None:
                k, v = key[s.start : s.end], value[s.start : s.end]  # [seq_len, kv_heads, D]
            else:
                k = k_cache.index_select(0, s.blocks).view(-1, kv_heads, d)[: s.seq_len]
                v = v_cache.index_select(0, s.blocks).view(-1, kv_heads, d)[: s.seq_len]
            k, v = k.transpose(0, 1), v.transpose(0, 1)  # [kv_heads, seq_len, D]
            q = query[s.start : s.end]  # [q_len, heads, D]
            if s.end - s.start == 1:
                # 4-D inputs: SDPA's CPU flash kernel (3-D falls back to the slower math path)
                q = q.view(1, kv_heads, heads // kv_heads, d)
                o = F.scaled_dot_product_attention(q, k[None], v[None], scale=scale)
                outs.append(o.reshape(1, heads, d))
                continue
            o = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                k[None],
                v[None],
                attn_mask=s.mask,
                is_causal=s.mask is None,
                scale=scale,
                enable_gqa=heads != kv_heads,
            )
            outs.append(o[0].transpose(0, 1))
        if p.num_real < t:
            outs.append(query.new_zeros(t - p.num_real, heads, d))
        return torch.cat(outs) if len(outs) > 1 else outs[0].contiguous()
