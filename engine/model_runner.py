"""Executes one SchedulerOutput: lay the batch out flat, build attention metadata, forward, copy blocks, sample.

No policy here: what runs, where its KV lives and which blocks are copied all come from the scheduler.

    batch order:  seq A (prefill chunk, 5 tokens) | seq B (decode, 1) | seq C (decode, 1) | fork of A (0)
    flat rows:    0 1 2 3 4                       | 5                 | 6                 |
    sample rows:  A -> 4, B -> 5, C -> 6, fork -> 4 (its parent's last row)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.core.request import Request
from engine.core.scheduler_output import RunnerOutput, ScheduledSequence, SchedulerOutput
from engine.cuda_graphs import CudaGraphs, batch_buckets, bucket_for
from engine.device import DeviceBinding
from engine.distributed.step_message import StepInputs
from engine.input_batch import InputBatch
from engine.kv_cache import allocate_kv_pool, layer_views
from engine.model_loader import ModelSpec
from engine.models.generic.checks import refuse_cuda_graphs
from engine.models.generic.model import TransformersCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.sampler import TokenSampler
from engine.sampling.make_sampler import make_sampler

# One step's forward on every rank: the runner's own (one process), or the executor's, which sends the
# step to the other ranks first (engine/distributed/executor.py).
Forward = Callable[[StepInputs], torch.Tensor | None]


class ModelRunner:
    def __init__(
        self,
        model: LlamaForCausalLM | TransformersCausalLM,
        spec: ModelSpec,
        kv_pool: torch.Tensor | int,
        block_size: int = 16,
        device: str | torch.device = "cpu",
        backend: AttentionBackend | None = None,
        sampler: TokenSampler | None = None,
        *,
        max_num_seqs: int = 64,
        max_num_batched_tokens: int = 2048,
        max_model_len: int = 4096,
        enable_cuda_graphs: bool = False,
    ) -> None:
        """kv_pool: the pool tensor from `engine.kv_cache.allocate_kv_pool`, or a block count to allocate.
        backend: replaces the model's attention backend when given. sampler: None -> make_sampler for the device.
        The max_* sizes preallocate the step buffers (they grow if exceeded, unless graphs are captured).
        enable_cuda_graphs: capture decode steps at every batch-size bucket now (CUDA only)."""
        self.model, self.spec, self.block_size = model, spec, block_size
        self.device = torch.device(device)
        # Before anything runs on the device here (graph capture included), and again per stepping thread.
        self._binding = DeviceBinding(self.device)
        self._binding.bind()
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
        self.sampler = (
            sampler
            if sampler is not None
            else make_sampler(spec.vocab_size, frozenset(spec.eos_token_ids), self.device)
        )
        self.buckets = batch_buckets(max_num_seqs)
        max_blocks = -(-max_model_len // block_size)
        self.batch = InputBatch(
            block_size, self.device, max(max_num_batched_tokens, self.buckets[-1]), max_num_seqs, max_blocks
        )
        # Pad decode-only steps to a bucket (CUDA graphs need it; tests turn it on alone on the CPU).
        self.pad_decode_batches = enable_cuda_graphs
        self.graphs: CudaGraphs | None = None
        if enable_cuda_graphs and isinstance(model, TransformersCausalLM):
            refuse_cuda_graphs(model.hf.config)  # before anything is captured
        if enable_cuda_graphs:
            self.graphs = CudaGraphs(model, self.kv_caches, self.batch, self.buckets, max_model_len)
            self.graphs.capture()
        # Seconds of the last step: model forward + logits, and the whole execute() call.
        self.last_forward_seconds = 0.0
        self.last_step_seconds = 0.0

    def execute(
        self, sched_out: SchedulerOutput, requests: Mapping[str, Request], forward: Forward | None = None
    ) -> RunnerOutput:
        """`forward`: how the prepared step runs (default: here only; see engine/distributed/executor.py)."""
        t0 = time.perf_counter()
        self._binding.bind()
        run = forward or self.forward
        if sched_out.is_empty:
            empty = self.batch.buffers.input_ids[:0]
            run(StepInputs(empty, empty, None, empty, sched_out.block_copies))
            return RunnerOutput(sampled_token_ids={})
        input_ids, positions, meta, sample_rows, sample_ids = self.prepare(
            sched_out.sequences, requests, sched_out.preempted_ids
        )
        t1 = time.perf_counter()
        logits = run(StepInputs(input_ids, positions, meta, sample_rows, sched_out.block_copies))
        t2 = time.perf_counter()
        if logits is None:
            out = RunnerOutput(sampled_token_ids={})
        else:
            with torch.inference_mode():
                result = self.sampler(logits, [requests[r] for r in sample_ids])
            out = RunnerOutput(
                sampled_token_ids=dict(zip(sample_ids, result.token_ids, strict=True)),
                logprobs={r: lp for r, lp in zip(sample_ids, result.logprobs, strict=True) if lp is not None},
            )
        self.last_forward_seconds = t2 - t1
        self.last_step_seconds = time.perf_counter() - t0
        return out

    def forward(self, inputs: StepInputs) -> torch.Tensor | None:
        """The step every rank runs: forward, logits of the sampled rows, block copies.
        Returns [B, V] fp32 logits (None with no sampled rows, and on ranks > 0 with tensor parallelism)."""
        if inputs.meta is None:
            self.copy_blocks(inputs.block_copies)
            return None
        with torch.inference_mode():
            if self.graphs is not None and self.graphs.can_replay(inputs.meta, inputs.input_ids):
                hidden = self.graphs.replay(inputs.num_tokens)  # [T_bucket, hidden]
            else:
                hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)  # [T, H]
            # A collective under tensor parallelism: every rank calls it when there are sampled rows.
            logits = (
                self.model.compute_logits(hidden[inputs.sample_rows]) if inputs.sample_rows.numel() else None
            )
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            # After the forward: a fork's copy of its parent's last block must include this step's KV.
            self.copy_blocks(inputs.block_copies)
        return logits

    def prepare(
        self,
        seqs: list[ScheduledSequence],
        requests: Mapping[str, Request] | None = None,
        preempted: Sequence[str] = (),
    ) -> tuple[torch.Tensor, torch.Tensor, AttentionMetadata, torch.Tensor, list[str]]:
        """Host-side layout of one step: (input_ids [T], positions [T], metadata, sample_rows [B], ids [B]).

        Decode-only steps are padded to a batch-size bucket when `pad_decode_batches` is set (always with
        CUDA graphs), so their tensors have the shapes a graph was captured with."""
        pad_to = None
        if self.pad_decode_batches and all(len(s.token_ids) == 1 for s in seqs):
            pad_to = bucket_for(sum(1 for s in seqs if s.token_ids), self.buckets)
        step = self.batch.prepare(
            seqs, alive=requests, pad_to=pad_to, full_width=self.graphs is not None, preempted=preempted
        )
        return step.input_ids, step.positions, step.meta, step.sample_rows, step.sample_ids

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        src = torch.tensor([c[0] for c in copies], dtype=torch.int64, device=self.device)
        dst = torch.tensor([c[1] for c in copies], dtype=torch.int64, device=self.device)
        # All layers, K and V, in one indexed copy (the read is materialised before the write).
        self.kv_pool[:, :, dst] = self.kv_pool[:, :, src]
