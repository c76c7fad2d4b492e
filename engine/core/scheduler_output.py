"""The typed contract between the scheduler (policy) and the model runner (execution).

`Scheduler.schedule() -> SchedulerOutput`; the runner executes it and returns `RunnerOutput`;
`Scheduler.update_from_output(scheduler_output, runner_output)` appends tokens and decides who finished.
Plain Python values only: no tensors cross this boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class ScheduledSequence:
    """One sequence's work in this step. Treat as read-only.

    Not frozen: one is built per running request per step, and a frozen dataclass's __init__ costs twice
    a plain one (~1.0 us against ~0.5 us, 0.13 ms per step at 256 requests)."""

    request_id: str
    # Token ids whose KV is computed this step: token_ids()[start_pos : start_pos + len(token_ids)].
    # Empty only for a fork (`fork_of` set): the sequence reuses its parent's KV and logits.
    token_ids: list[int]
    # Absolute position of token_ids[0] (== num_computed_tokens before this step).
    start_pos: int
    # The sequence's whole block table after this step's allocation: the block manager's own immutable
    # tuple, the same object from step to step until a block is appended (the runner relies on that to
    # skip rewriting its row; see engine/core/block_manager.py). A list works too, compared by value.
    block_ids: tuple[int, ...] | list[int]
    # True when this chunk reaches the end of the known tokens, so a next token is sampled.
    sample: bool
    # For the first step of an n > 1 sibling: the request whose last logits row this one samples from.
    fork_of: str | None = None

    @property
    def num_new_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def context_len(self) -> int:
        """Tokens of context after this step (cached + new)."""
        return self.start_pos + len(self.token_ids)


@dataclass(frozen=True)
class SchedulerOutput:
    # In batch order: the runner lays out tokens in this order and returns samples in this order.
    sequences: list[ScheduledSequence]
    num_batched_tokens: int
    # (src_block, dst_block) copies the runner performs AFTER this step's forward (copy-on-write of a
    # partly filled last block when an n > 1 group forks).
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # Requests preempted in this step (their blocks were freed; they will be recomputed).
    preempted_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.sequences


@dataclass(frozen=True)
class RunnerOutput:
    """What the model runner returns for one step."""

    # request_id -> sampled token id, only for sequences scheduled with sample=True.
    sampled_token_ids: dict[str, int]
    # request_id -> [(token_id, logprob), ...]: the sampled token first, then the top-k; only when asked.
    logprobs: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
