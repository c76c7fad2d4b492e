"""Executes one SchedulerOutput: lay the batch out flat, build attention metadata, forward, copy blocks, sample.

No policy here: what runs, where its KV lives and which blocks are copied all come from the scheduler.

    batch order:  seq A (prefill chunk, 5 tokens) | seq B (decode, 1) | seq C (decode, 1) | fork of A (0)
    flat rows:    0 1 2 3 4                       | 5                 | 6                 |
    sample rows:  A -> 4, B -> 5, C -> 6, fork -> 4 (its parent's last row)
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.core.request import Request
from engine.core.scheduler_output import RunnerOutput, ScheduledSequence, SchedulerOutput
from engine.kv_cache import allocate_kv_pool, layer_views
from engine.model_loader import ModelSpec
from engine.models.generic.model import TransformersCausalLM
from engine.models.llama import LlamaForCausalLM


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM | TransformersCausalLM,
        spec: ModelSpec,
        kv_pool: torch.Tensor | int,
        block_size: int = 16,
        device: str | torch.device = "cpu",
        backend: AttentionBackend | None = None,
        sampler: Any = None,
    ) -> None:
        """kv_pool: the pool tensor from `engine.kv_cache.allocate_kv_pool`, or a block count to allocate.
        backend: replaces the model's attention backend when given. sampler: None -> engine.sampler.Sampler."""
        self.model, self.spec, self.block_size = model, spec, block_size
        self.device = torch.device(device)
        if backend is not None:
            model.attn_backend = backend
        if isinstance(kv_pool, int):
            kv_pool = allocate_kv_pool(spec, kv_pool, block_size, self.device)
        if kv_pool.shape[3] != block_size:
            raise ValueError(f"kv_pool block size {kv_pool.shape[3]} != block_size {block_size}")
        # [num_layers, 2, num_blocks, block_size, num_kv_heads, head_dim]
        self.kv_pool = kv_pool
        self.num_blocks = kv_pool.shape[2]
        self.kv_caches = layer_views(kv_pool)
        if sampler is None:
            from engine.sampler import Sampler

            sampler = Sampler(spec.vocab_size, spec.eos_token_ids)
        self.sampler = sampler
        # Seconds of the last step: model forward + logits, and the whole execute() call.
        self.last_forward_seconds = 0.0
        self.last_step_seconds = 0.0

    def execute(self, sched_out: SchedulerOutput, requests: Mapping[str, Request]) -> RunnerOutput:
        t0 = time.perf_counter()
        if sched_out.is_empty:
            self._copy_blocks(sched_out.block_copies)
            return RunnerOutput(sampled_token_ids={})
        input_ids, positions, meta, sample_rows, sample_ids = self.prepare(sched_out.sequences)
        t1 = time.perf_counter()
        with torch.inference_mode():
            hidden = self.model(input_ids, positions, self.kv_caches, meta)  # [T, hidden]
            logits = self.model.compute_logits(hidden[sample_rows]) if sample_ids else None  # [B, V] fp32
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            t2 = time.perf_counter()
            # After the forward: a fork's copy of its parent's last block must include this step's KV.
            self._copy_blocks(sched_out.block_copies)
            if logits is None:
                out = RunnerOutput(sampled_token_ids={})
            else:
                result = self.sampler(logits, [requests[r] for r in sample_ids])
                out = RunnerOutput(
                    sampled_token_ids=dict(zip(sample_ids, result.token_ids, strict=True)),
                    logprobs={
                        r: lp for r, lp in zip(sample_ids, result.logprobs, strict=True) if lp is not None
                    },
                )
        self.last_forward_seconds = t2 - t1
        self.last_step_seconds = time.perf_counter() - t0
        return out

    def prepare(
        self, seqs: list[ScheduledSequence]
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, list[str]]:
        """Host-side layout of one step: (input_ids [T], positions [T], metadata, sample_rows [B], ids [B])."""
        bs = self.block_size
        ids: list[int] = []
        pos: list[int] = []
        slots: list[int] = []
        qsl = [0]
        seq_lens: list[int] = []
        tables: list[list[int]] = []
        last_row: dict[str, int] = {}
        for s in seqs:
            if not s.token_ids:
                if s.fork_of is None:
                    raise ValueError(f"sequence {s.request_id} has no tokens and is not a fork")
                continue
            blocks = s.block_ids
            ids.extend(s.token_ids)
            p = range(s.start_pos, s.context_len)
            pos.extend(p)
            slots.extend(blocks[i // bs] * bs + i % bs for i in p)
            qsl.append(len(ids))
            seq_lens.append(s.context_len)
            tables.append(blocks)
            last_row[s.request_id] = len(ids) - 1
        sample_ids = [s.request_id for s in seqs if s.sample]
        sample_rows = []
        for s in seqs:
            if s.sample:
                source = s.request_id if s.token_ids else s.fork_of
                if source not in last_row:
                    raise ValueError(f"fork {s.request_id}: parent {source} has no tokens in this step")
                sample_rows.append(last_row[source])

        width = max(len(t) for t in tables)
        padded = [t + [0] * (width - len(t)) for t in tables]
        qlens = tuple(b - a for a, b in zip(qsl, qsl[1:], strict=False))
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_start_loc=torch.tensor(qsl, dtype=torch.int32, device=dev),
            seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=dev),
            block_tables=torch.tensor(padded, dtype=torch.int32, device=dev),
            max_query_len=max(qlens),
            max_seq_len=max(seq_lens),
            is_decode_only=all(q == 1 for q in qlens),
            query_lens_cpu=qlens,
            seq_lens_cpu=tuple(seq_lens),
        )
        return (
            torch.tensor(ids, dtype=torch.int64, device=dev),
            torch.tensor(pos, dtype=torch.int64, device=dev),
            meta,
            torch.tensor(sample_rows, dtype=torch.int64, device=dev),
            sample_ids,
        )

    def _copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        src = torch.tensor([c[0] for c in copies], dtype=torch.int64, device=self.device)
        dst = torch.tensor([c[1] for c in copies], dtype=torch.int64, device=self.device)
        # All layers, K and V, in one indexed copy (the read is materialised before the write).
        self.kv_pool[:, :, dst] = self.kv_pool[:, :, src]
