"""Executes one SchedulerOutput: lay the batch out flat, build attention metadata, forward, copy blocks, sample.

No policy here: what runs, where its KV lives and which blocks are copied all come from the scheduler.

    batch order:  seq A (prefill chunk, 5 tokens) | seq B (decode, 1) | seq C (decode, 1) | fork of A (0)
    flat rows:    0 1 2 3 4                       | 5                 | 6                 |
    sample rows:  A -> 4, B -> 5, C -> 6, fork -> 4 (its parent's last row)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from operator import attrgetter

import numpy as np
import torch

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.batch_rows import BatchRows
from engine.core.scheduler_output import RunnerOutput, ScheduledSequence, SchedulerOutput
from engine.cuda_graphs import CudaGraphs, batch_buckets, bucket_for
from engine.device import DeviceBinding
from engine.distributed.step_message import StepInputs
from engine.host_to_device import to_device
from engine.input_batch import InputBatch, SequenceLayout
from engine.kv_cache import allocate_kv_pool, layer_views
from engine.model_loader import ModelSpec
from engine.models.generic.checks import refuse_cuda_graphs
from engine.models.generic.model import TransformersCausalLM
from engine.models.llama import LlamaForCausalLM
from engine.prompt_logprobs import PromptRows, PromptScores
from engine.sampling.interface import SampledIds, TokenSampler
from engine.sampling.make_sampler import make_sampler

# The tokens of a step the host does not know yet (the last sampled token of a request whose step is still
# in flight, async scheduling): (their flat indices in input_ids [N] int64, their request ids [N]).
Placeholders = tuple[np.ndarray, list[str]]
_RID, _START = attrgetter("request_id"), attrgetter("start_pos")
_NUM_NEW, _SAMPLE = attrgetter("num_new_tokens"), attrgetter("sample")

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
        # The persistent batch: one row per request the runner knows (tokens, block table, sampling
        # parameters, seen tokens), made from the scheduler's NewRequest, grown by the sampled ids.
        self.rows = BatchRows(
            getattr(self.sampler, "vocab_size", spec.vocab_size),
            getattr(self.sampler, "eos_token_ids", frozenset(spec.eos_token_ids)),
            rows=max_num_seqs,
            width=max_blocks,
        )
        self.batch = InputBatch(
            block_size,
            self.device,
            max(max_num_batched_tokens, self.buckets[-1]),
            max_num_seqs,
            max_blocks,
            rows=self.rows,
        )
        # Pad decode-only steps to a bucket (CUDA graphs need it; tests turn it on alone on the CPU).
        self.pad_decode_batches = enable_cuda_graphs
        self.graphs: CudaGraphs | None = None
        if enable_cuda_graphs and isinstance(model, TransformersCausalLM):
            refuse_cuda_graphs(model.hf.config)  # before anything is captured
        if enable_cuda_graphs:
            self.graphs = CudaGraphs(model, self.kv_caches, self.batch, self.buckets, max_model_len)
            self.graphs.capture()
        # Seconds of the last step: model forward + logits (on CUDA the launch only: nothing waits for the
        # device before the sampled ids), and the whole submit() call.
        self.last_forward_seconds = 0.0
        self.last_step_seconds = 0.0
        # Requests with params.prompt_logprobs whose prompt logprobs have not gone out yet.
        self.prompt_scores: dict[str, PromptScores] = {}
        # The last step whose sampled ids are not in `rows` yet.
        self._unfolded: PendingOutput | None = None

    def execute(self, sched_out: SchedulerOutput, forward: Forward | None = None) -> RunnerOutput:
        """Run one step and wait for its sampled ids."""
        return self.submit(sched_out, forward).result()

    def submit(self, sched_out: SchedulerOutput, forward: Forward | None = None) -> PendingOutput:
        """Run one step as far as the device allows without waiting for it; `result()` on the returned
        handle waits for its sampled ids. With a step still unread (async scheduling), that step's ids
        enter this one's inputs on the device (placeholders), and are folded into the rows
        before this step samples (its penalties, seeds and grammar masks see them). `forward`: how the
        prepared step runs (default: here only; see engine/distributed/executor.py)."""
        t0 = time.perf_counter()
        self._binding.bind()
        run = forward or self.forward
        last = self._unfolded
        if last is not None and last.is_read:
            self._fold()  # synchronous scheduling: the engine has read it already
        self._apply(sched_out)
        if sched_out.is_empty:
            empty = self.batch.buffers.input_ids[:0]
            run(StepInputs(empty, empty, None, empty, sched_out.block_copies))
            self._fold()
            return PendingOutput.done(RunnerOutput(sampled_token_ids={}))
        input_ids, positions, meta, sample_rows, sample_ids, placeholders, layouts = self.prepare(
            sched_out.sequences
        )
        if len(placeholders[0]):
            assert self._unfolded is not None
            self._fill_placeholders(input_ids, placeholders, self._unfolded)
        prompt = self._prompt_rows(layouts) if layouts is not None and self.prompt_scores else None
        if prompt is not None:  # their logits after the sampled rows': [B + P]
            extra = to_device(prompt.flat_rows, sample_rows.device, torch.int64)
            sample_rows = torch.cat([sample_rows, extra])
        t1 = time.perf_counter()
        logits = run(StepInputs(input_ids, positions, meta, sample_rows, sched_out.block_copies))
        t2 = time.perf_counter()
        self._fold()
        if logits is None:
            handle = PendingOutput.done(RunnerOutput(sampled_token_ids={}))
        else:
            num_sampled = len(sample_ids)
            with torch.inference_mode():
                if prompt is not None:
                    prompt.launch(logits[num_sampled:], self.spec.vocab_size)
                    logits = logits[:num_sampled]
                sampled = self.sampler.launch(logits, self.rows.view(sample_ids)) if num_sampled else None
            # Prompt logprobs go out with the request's first sampled token, once complete.
            scores = self.prompt_scores
            ready = {r: scores[r] for r in sample_ids if r in scores} if scores else None
            handle = PendingOutput(sample_ids, sampled, prompt, ready)
            self._unfolded = handle
        self.last_forward_seconds = t2 - t1
        self.last_step_seconds = time.perf_counter() - t0
        return handle

    def _apply(self, sched_out: SchedulerOutput) -> None:
        """The scheduler's diff: forget finished requests, free preempted requests' blocks, meet new ones."""
        rows = self.rows
        for request_id in sched_out.finished_ids:
            rows.remove(request_id)
            self.prompt_scores.pop(request_id, None)
        for request_id in sched_out.preempted_ids:
            rows.clear_blocks(request_id)  # the row stays: it resumes from its own tokens
        for new in sched_out.new_requests:
            rows.remove(new.request_id)  # an id reused after it finished
            rows.add(new.request_id, new.prompt_token_ids, new.output_token_ids, new.params, new.sample_index)
            # Sample 0 carries the request's prompt logprobs; a resumed request sent them before.
            k = new.params.prompt_logprobs
            if k is not None and new.sample_index == 0 and not new.output_token_ids:
                self.prompt_scores[new.request_id] = PromptScores(new.prompt_token_ids, k)

    def _prompt_rows(self, layouts: list[SequenceLayout]) -> PromptRows | None:
        """The rows of this step whose logits score a prompt token (engine/prompt_logprobs.py)."""
        rows = PromptRows()
        flat = 0
        for layout in layouts:
            scores = self.prompt_scores.get(layout.request_id)
            if scores is not None and scores.sent:
                del self.prompt_scores[layout.request_id]
            elif scores is not None:
                rows.add(scores, layout.start_pos, len(layout.token_ids), flat)
            flat += len(layout.token_ids)
        return rows if len(rows) else None

    def _layouts(self, seqs: list[ScheduledSequence]) -> tuple[list[SequenceLayout], Placeholders]:
        """Each sequence's tokens from its row, its block table updated from the diff. Also the tokens
        the host does not know yet (`Placeholders`)."""
        rows = self.rows
        row_of, token_ids, num_tokens = rows.row_of, rows.token_ids, rows.num_tokens
        out: list[SequenceLayout] = []
        add = out.append
        at: list[int] = []
        waiting: list[str] = []
        flat = 0
        for seq in seqs:
            rid, start, n = seq.request_id, seq.start_pos, seq.num_new_tokens
            if seq.whole_table:
                rows.set_blocks(rid, seq.new_block_ids)
            elif seq.new_block_ids:
                rows.append_blocks(rid, seq.new_block_ids)
            row = row_of[rid]
            end = start + n
            if end > num_tokens[row]:  # only a decode of the token the step in flight samples
                at.append(flat + n - 1)
                waiting.append(rid)
                tokens = [*token_ids[row, start : end - 1].tolist(), 0]
                add(SequenceLayout(rid, tokens, start, seq.sample, seq.fork_of))
            else:
                add(SequenceLayout(rid, token_ids[row, start:end].tolist(), start, seq.sample, seq.fork_of))
            flat += n
        return out, (np.array(at, dtype=np.int64), waiting)

    def _decode_columns(
        self, seqs: list[ScheduledSequence]
    ) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray | None, Placeholders] | None:
        """A decode-only step (one token per sequence, no fork) as columns of the persistent batch, with
        no per-sequence Python beyond reading the fields in C: (request ids, rows [S], input ids [S],
        start positions [S], sample flags [S] or None when all sample, placeholders). None otherwise."""
        n = len(seqs)
        qlens = np.fromiter(map(_NUM_NEW, seqs), dtype=np.int64, count=n)
        if not n or not (qlens == 1).all():
            return None
        rows = self.rows
        for seq in [s for s in seqs if s.new_block_ids or s.whole_table]:  # one in block_size, as a rule
            if seq.whole_table:
                rows.set_blocks(seq.request_id, seq.new_block_ids)
            else:
                rows.append_blocks(seq.request_id, seq.new_block_ids)
        rids = list(map(_RID, seqs))
        row = np.fromiter(map(rows.row_of.__getitem__, rids), dtype=np.int64, count=n)
        start = np.fromiter(map(_START, seqs), dtype=np.int64, count=n)
        known = rows.num_tokens[row]
        ids = rows.token_ids[row, np.minimum(start, known - 1)]  # [S]
        missing = start >= known  # the token the step in flight samples
        at = np.flatnonzero(missing)
        if len(at):
            ids[at] = 0
        waiting = rids if len(at) == n else [rids[i] for i in at.tolist()]
        samples = np.fromiter(map(_SAMPLE, seqs), dtype=bool, count=n)
        return rids, row, ids, start, None if samples.all() else samples, (at, waiting)

    def _fill_placeholders(
        self, input_ids: torch.Tensor, placeholders: Placeholders, last: PendingOutput
    ) -> None:
        """input_ids[i] = the id the step in flight samples for the request, on the device (no host read)."""
        assert last.sampled is not None
        flat, waiting = placeholders
        dev = input_ids.device
        tokens = last.sampled.tokens()
        if waiting == last.sample_ids:  # the same requests in the same order: the common decode step
            input_ids[to_device(flat, dev, torch.int64)] = tokens
            return
        index = {rid: i for i, rid in enumerate(last.sample_ids)}
        src = to_device([index[r] for r in waiting], dev, torch.int64)
        input_ids[to_device(flat, dev, torch.int64)] = tokens[src]

    def _fold(self) -> None:
        """Append the last unread step's sampled ids to their rows (waits for them)."""
        last, self._unfolded = self._unfolded, None
        if last is None:
            return
        sampled, row_of = last.result().sampled_token_ids, self.rows.row_of
        rows = [row_of.get(rid, -1) for rid in sampled]  # -1: finished since, no row
        tokens = list(sampled.values())
        if -1 in rows:
            tokens = [t for r, t in zip(rows, tokens, strict=True) if r >= 0]
            rows = [r for r in rows if r >= 0]
        if rows:
            self.rows.append_tokens(np.array(rows, dtype=np.int64), np.array(tokens, dtype=np.int64))

    def forward(self, inputs: StepInputs) -> torch.Tensor | None:
        """The step every rank runs: forward, logits of the sampled rows, block copies.
        Returns [B, V] fp32 logits (None with no sampled rows, and on ranks > 0 with tensor parallelism)."""
        if inputs.meta is None:
            self.copy_blocks(inputs.block_copies)
            return None
        with torch.inference_mode():
            graphs = self.graphs
            graph = graphs.find(inputs.meta, inputs.input_ids) if graphs is not None else None
            if graphs is not None and graph is not None:
                hidden = graphs.replay(graph)  # [T_bucket, hidden]
            else:
                hidden = self.model(inputs.input_ids, inputs.positions, self.kv_caches, inputs.meta)  # [T, H]
            # A collective under tensor parallelism: every rank calls it when there are sampled rows.
            logits = (
                self.model.compute_logits(hidden[inputs.sample_rows]) if inputs.sample_rows.numel() else None
            )
            # After the forward: a fork's copy of its parent's last block must include this step's KV.
            self.copy_blocks(inputs.block_copies)
        return logits

    def prepare(
        self, seqs: list[ScheduledSequence]
    ) -> tuple[
        torch.Tensor,
        torch.Tensor,
        AttentionMetadata,
        torch.Tensor,
        list[str],
        Placeholders,
        list[SequenceLayout] | None,
    ]:
        """Host-side layout of one step: (input_ids [T], positions [T], metadata, sample_rows [B], ids [B],
        the placeholders, the sequences' layouts (None for a decode step laid out from columns)).

        Decode-only steps are padded to a batch-size bucket when `pad_decode_batches` is set (always with
        CUDA graphs), so their tensors have the shapes a graph was captured with."""
        full_width = self.graphs is not None
        decode = None if self.prompt_scores else self._decode_columns(seqs)
        if decode is not None:
            rids, rows, ids, start, samples, placeholders = decode
            pad_to = bucket_for(len(rids), self.buckets) if self.pad_decode_batches else None
            step = self.batch.lay_out(rids, rows, ids, start, None, samples, None, pad_to, full_width)
            layouts = None
        else:
            layouts, placeholders = self._layouts(seqs)
            pad_to = None
            if self.pad_decode_batches and all(len(s.token_ids) == 1 for s in layouts):
                pad_to = bucket_for(sum(1 for s in layouts if s.token_ids), self.buckets)
            step = self.batch.prepare(layouts, pad_to=pad_to, full_width=full_width)
        return (
            step.input_ids,
            step.positions,
            step.meta,
            step.sample_rows,
            step.sample_ids,
            placeholders,
            layouts,
        )

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        if not copies:
            return
        src = to_device([c[0] for c in copies], self.device, torch.int64)
        dst = to_device([c[1] for c in copies], self.device, torch.int64)
        # All layers, K and V, in one indexed copy (the read is materialised before the write).
        self.kv_pool[:, :, dst] = self.kv_pool[:, :, src]


class PendingOutput:
    """A step's RunnerOutput once its sampled ids are read; `result()` waits for them (once)."""

    def __init__(
        self,
        sample_ids: list[str],
        sampled: SampledIds | None,
        prompt: PromptRows | None = None,
        prompt_ready: dict[str, PromptScores] | None = None,
    ) -> None:
        self.sample_ids = sample_ids  # [B] request ids, in the order of the sampled rows
        self.sampled = sampled  # None when the step samples nothing
        self.prompt = prompt  # the step's prompt-logprob rows, read with the sampled ids
        # Sampled requests with prompt logprobs still to send: sent now if complete.
        self.prompt_ready = prompt_ready or {}
        self._out: RunnerOutput | None = None

    @classmethod
    def done(cls, out: RunnerOutput) -> PendingOutput:
        pending = cls([], None)
        pending._out = out
        return pending

    @property
    def is_read(self) -> bool:
        return self._out is not None

    def result(self) -> RunnerOutput:
        if self._out is None:
            if self.prompt is not None:
                self.prompt.read()
            prompt_logprobs = {}
            for rid, scores in self.prompt_ready.items():
                if scores.complete and not scores.sent:
                    scores.sent = True
                    prompt_logprobs[rid] = scores.entries
            if self.sampled is None:
                self._out = RunnerOutput(sampled_token_ids={}, prompt_logprobs=prompt_logprobs)
                return self._out
            result = self.sampled.read()
            ids = self.sample_ids
            self._out = RunnerOutput(
                sampled_token_ids=dict(zip(ids, result.token_ids, strict=True)),
                logprobs={r: lp for r, lp in zip(ids, result.logprobs, strict=True) if lp is not None},
                prompt_logprobs=prompt_logprobs,
            )
        return self._out
