"""Helpers for model tests: named tiny-model variants, transformers references, a paged forward."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.attention.metadata import AttentionMetadata
from engine.batch_view import RowView
from engine.core.request import Request
from engine.sampling.interface import SampledIds

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}
# name -> (arch, make_tiny_model overrides)
VARIANTS = {
    "llama": ("llama", {}),
    "mistral": ("mistral", {}),
    "qwen2": ("qwen2", {}),
    "qwen3": ("qwen3", {}),
    "llama-tied": ("llama", {"tie_word_embeddings": True}),
    "llama-mqa": ("llama", {"num_heads": 4, "num_kv_heads": 1}),
    "qwen2-gqa4": ("qwen2", {"num_heads": 8, "num_kv_heads": 2}),
    "llama3-rope": ("llama", {"rope_scaling": LLAMA3_ROPE, "rope_theta": 500000.0}),
    "llama-linear-rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
}


def metadata(chunks: list[tuple[int, int, Sequence[int]]], block_size: int) -> AttentionMetadata:
    """chunks: (start_pos, num_new_tokens, block_ids) per sequence -> metadata for one step."""
    slots, qsl, lens = [], [0], []
    for start, n, blocks in chunks:
        slots += [blocks[p // block_size] * block_size + p % block_size for p in range(start, start + n)]
        qsl.append(qsl[-1] + n)
        lens.append(start + n)
    width = max(len(c[2]) for c in chunks)
    tables = [list(c[2]) + [0] * (width - len(c[2])) for c in chunks]
    qlens = tuple(c[1] for c in chunks)
    return AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.int64),
        query_start_loc=torch.tensor(qsl, dtype=torch.int32),
        seq_lens=torch.tensor(lens, dtype=torch.int32),
        block_tables=torch.tensor(tables, dtype=torch.int32),
        max_query_len=max(qlens),
        max_seq_len=max(lens),
        is_decode_only=all(q == 1 for q in qlens),
        query_lens_cpu=qlens,
        seq_lens_cpu=tuple(lens),
    )


@dataclass(frozen=True)
class GreedyResult:
    token_ids: list[int]
    logprobs: list


class GreedySampler:
    """Stand-in for the host Sampler: argmax, so these tests do not depend on the sampler's work."""

    def __init__(self, vocab_size: int = 0, eos_token_ids: frozenset[int] = frozenset()) -> None:
        self.calls: list[tuple[torch.Tensor, list[str]]] = []

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> GreedyResult:
        self.calls.append((logits.clone(), [r.request_id for r in requests]))
        return GreedyResult(logits.argmax(-1).tolist(), [None] * len(requests))

    def launch(self, logits: torch.Tensor, view: RowView) -> SampledIds:
        self.calls.append((logits.clone(), list(view.request_ids)))
        result = GreedyResult(logits.argmax(-1).tolist(), [None] * len(view))
        return SampledIds.ready(result, logits.device)  # type: ignore[arg-type]


@dataclass
class TableLayout:
    """A SequenceLayout with its whole block table, for tests that lay steps out without a runner."""

    request_id: str
    token_ids: list[int]
    start_pos: int
    block_ids: list[int] | None  # None: the row's table is already written
    sample: bool
    fork_of: str | None = None

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


def prepare_with_tables(batch, seqs: list[TableLayout], **options):
    """batch.prepare(seqs) after giving each sequence a row (if new) holding its block table."""
    from engine.input_batch import SequenceLayout
    from engine.sampling_params import SamplingParams

    rows = batch.rows
    for s in seqs:
        if s.request_id not in rows:
            rows.add(s.request_id, [], [], SamplingParams())
        if s.block_ids is not None:
            rows.set_blocks(s.request_id, s.block_ids)
    layouts = [SequenceLayout(s.request_id, s.token_ids, s.start_pos, s.sample, s.fork_of) for s in seqs]
    return batch.prepare(layouts, **options)
