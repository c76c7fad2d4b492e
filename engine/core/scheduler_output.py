"""The typed contract between the scheduler (policy) and the model runner (execution): diffs, as vLLM V1's.

`Scheduler.schedule() -> SchedulerOutput`; the runner executes it and returns `RunnerOutput`;
`Scheduler.update_from_output(scheduler_output, runner_output)` appends tokens and decides who finished.

A request reaches the runner once, as a `NewRequest` (prompt, parameters, tokens it already has); the runner
keeps its own copy of each request's state (a row of engine/batch_rows.py) and appends the ids it samples. After
that a step names, per scheduled sequence, only what changed: how many tokens from which position, the
blocks appended since the runner last heard (the whole table on the first step and after preemption),
whether a token is sampled. Finished and preempted ids tell the runner what to drop. Plain Python values
only: no tensors, and no scheduler object crosses this boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class NewRequest:
    """Everything the runner keeps about a request, sent on its first scheduled step."""

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams  # the structured-output spec is params.grammar_spec
    sample_index: int
    # Tokens it had already generated (a request resumed from another worker); a copy.
    output_token_ids: list[int]


@dataclass(slots=True)
class ScheduledSequence:
    """One sequence's work in this step. Treat as read-only.

    Not frozen: one is built per running request per step, and a frozen dataclass's __init__ costs twice
    a plain one's."""

    request_id: str
    # Tokens whose KV is computed this step: token_ids()[start_pos : start_pos + num_new_tokens] of the
    # runner's copy. 0 only for a fork (`fork_of` set): it reuses its parent's KV and logits. With async
    # scheduling the last of them may be the token the step in flight samples (a placeholder).
    num_new_tokens: int
    # Absolute position of the first of them (== num_computed_tokens before this step).
    start_pos: int
    # Block ids appended to the request's table since the runner last heard of it, in order; the whole
    # table when `whole_table`.
    new_block_ids: tuple[int, ...]
    # True when this chunk reaches the end of the known tokens, so a next token is sampled.
    sample: bool
    # new_block_ids is the request's whole table: its first step, or its first since a preemption.
    whole_table: bool = False
    # For the first step of an n > 1 sibling: the request whose last logits row this one samples from.
    fork_of: str | None = None

    @property
    def context_len(self) -> int:
        """Tokens of context after this step (cached + new)."""
        return self.start_pos + self.num_new_tokens


@dataclass(frozen=True)
class SchedulerOutput:
    # In batch order: the runner lays out tokens in this order and returns samples in this order.
    sequences: list[ScheduledSequence]
    num_batched_tokens: int
    # Requests the runner meets for the first time in this step (their sequences are in `sequences`).
    new_requests: list[NewRequest] = field(default_factory=list)
    # (src_block, dst_block) copies the runner performs AFTER this step's forward (copy-on-write of a
    # partly filled last block when an n > 1 group forks).
    block_copies: list[tuple[int, int]] = field(default_factory=list)
    # Requests preempted in this step (their blocks were freed; they will be recomputed).
    preempted_ids: list[str] = field(default_factory=list)
    # Requests the runner knows that finished (or were aborted) since the last SchedulerOutput.
    finished_ids: list[str] = field(default_factory=list)

    @property
    def is_empty(self) -> bool:
        return not self.sequences


@dataclass(frozen=True)
class RunnerOutput:
    """What the model runner returns for one step: sampled ids, and logprobs where asked. Nothing else."""

    # request_id -> sampled token id, only for sequences scheduled with sample=True.
    sampled_token_ids: dict[str, int]
    # request_id -> [(token_id, logprob), ...]: the sampled token first, then the top-k; only when asked.
    logprobs: dict[str, list[tuple[int, float]]] = field(default_factory=dict)
    # request_id -> its prompt's logprobs (engine/outputs.py PromptLogprobs), once, in the step of its
    # first sampled token; only for requests with params.prompt_logprobs.
    prompt_logprobs: dict[str, list[list[tuple[int, float]] | None]] = field(default_factory=dict)
