"""Attention backend on the Triton kernels in `kernels/` (CUDA, or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import torch

from engine.attention.metadata import AttentionMetadata
from kernels.kv_write import write_kv
from kernels.paged_attention import paged_attention
from kernels.paged_decode_split import choose_num_splits, paged_decode_split

CPU_NUM_SMS = 8  # stand-in "SM count" off-GPU, so the interpreter exercises the split path on small batches


def _num_sms(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return CPU_NUM_SMS


class TritonAttentionBackend:
    name = "triton"

    def __init__(self, num_sms: int | None = None) -> None:
        # None: read from the device of the first forward (cached per device).
        self._num_sms_override = num_sms
        self._num_sms: dict[torch.device, int] = {}

    def write_kv(
        self,
        key: torch.Tensor,  # [T, Hkv, D]
        value: torch.Tensor,  # [T, Hkv, D]
        k_cache: torch.Tensor,  # [num_blocks, block_size, Hkv, D]
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
    ) -> None:
        write_kv(key, value, k_cache, v_cache, meta.slot_mapping)

    def num_splits(
        self, meta: AttentionMetadata, num_kv_heads: int, device: torch.device, window: int | None = None
    ) -> int:
        """Split-KV only for pure decode steps the heuristic says leave SMs idle. A windowed layer's
        query reads at most `window` keys, so the split is sized on that, not on the context length."""
        if not meta.is_decode_only:
            return 1
        sms = self._num_sms_override
        if sms is None:
            sms = self._num_sms.get(device)
        if sms is None:  # once per device: this runs per layer per step (setdefault would look it up)
            sms = self._num_sms[device] = _num_sms(device)
        keys = meta.max_seq_len if window is None else min(meta.max_seq_len, window)
        return choose_num_splits(meta.num_seqs, num_kv_heads, keys, sms)

    def forward(
        self,
        query: torch.Tensor,  # [T, Hq, D]; T may exceed the real token count (padding rows left untouched)
        key: torch.Tensor,  # [T, Hkv, D]: unused, the kernels read every key from the cache
        value: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        *,
        window: int | None = None,  # see AttentionBackend.forward
        softcap: float | None = None,
    ) -> torch.Tensor:  # [T, Hq, D], dtype of query
        out = torch.empty_like(query)
        num_real = sum(meta.query_lens_cpu)
        if num_real < query.shape[0]:
            out[num_real:].zero_()  # padding rows: defined output, no kernel writes them
        splits = self.num_splits(meta, k_cache.shape[2], query.device, window)
        if splits > 1:
            paged_decode_split(
                query[: meta.num_seqs],
                k_cache,
                v_cache,
                meta.block_tables,
                meta.seq_lens,
                meta.max_seq_len,
                scale,
                splits,
                out=out[: meta.num_seqs],
                window=window,
                softcap=softcap,
            )
            return out
        return paged_attention(
            query,
            k_cache,
            v_cache,
            meta.block_tables,
            meta.seq_lens,
            meta.query_start_loc,
            meta.max_query_len,
            meta.max_seq_len,
            scale,
            out=out,
            window=window,
            softcap=softcap,
        )
