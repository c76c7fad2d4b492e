"""State of one sequence as the scheduler sees it: plain ints and lists, no torch."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine.sampling_params import SamplingParams

if TYPE_CHECKING:  # finish_rules imports this module
    from engine.core.finish_rules import StopTriggers


class RequestStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    # A sibling of an n > 1 group that waits for its parent's prefill to finish, then forks from it.
    WAITING_FOR_FORK = "waiting_for_fork"
    # A constrained request whose grammar is still compiling (engine/structured/); not schedulable yet.
    WAITING_FOR_GRAMMAR = "waiting_for_grammar"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"

    @property
    def is_finished(self) -> bool:
        return self.name.startswith("FINISHED")


FINISH_REASONS = {
    RequestStatus.FINISHED_STOPPED: "stop",
    RequestStatus.FINISHED_LENGTH: "length",
    RequestStatus.FINISHED_ABORTED: "abort",
}


@dataclass(eq=False)
class Request:
    """One sequence to generate. For `n > 1` the engine makes n of these sharing a `group_id`.

    `token_ids() = prompt_token_ids + output_token_ids`; the scheduler computes KV for
    `token_ids()[:num_computed_tokens]` and, each step, feeds the next chunk of tokens whose KV is missing.
    """

    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    arrival_time: float
    # Smaller runs first under the "priority" policy; ties broken by arrival order.
    priority: int = 0
    # Which of the group's n samples this is (0 for n == 1).
    sample_index: int = 0
    # The user's request id; equals request_id when n == 1.
    group_id: str = ""
    # Tokens generated before this request was (re)submitted, e.g. by a worker that crashed; they count
    # towards max_tokens and are part of the context, but are not emitted again.
    output_token_ids: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    # Tokens of the prompt found in the prefix cache at the last admission (for statistics).
    num_cached_tokens: int = 0
    status: RequestStatus = RequestStatus.WAITING
    num_preemptions: int = 0
    # Tokens scheduled to be sampled whose ids are not back yet (async scheduling: the step in flight).
    num_output_placeholders: int = 0
    # Whether the runner holds this request's state, and how many of its blocks it has been told about
    # (0: the next step sends the whole table).
    sent_to_runner: bool = False
    num_blocks_sent: int = 0
    # prompt + output as one list, extended in place by append_output_token (see token_ids()).
    _token_ids: list[int] | None = field(default=None, init=False, repr=False)
    # Set by the scheduler when the request is added (None: not known yet, check_stop every step).
    stop_triggers: StopTriggers | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not self.group_id:
            self.group_id = self.request_id

    def token_ids(self) -> list[int]:
        """prompt + output without copying each step; callers must not mutate it."""
        # Runs once per running request per step: no property call in the common case.
        tokens = self._token_ids
        if tokens is None or len(tokens) != len(self.prompt_token_ids) + len(self.output_token_ids):
            tokens = self._token_ids = self.prompt_token_ids + self.output_token_ids
        return tokens

    def append_output_token(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        if self._token_ids is not None:
            self._token_ids.append(token_id)

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_token_ids) + len(self.output_token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.output_token_ids)

    @property
    def max_total_tokens(self) -> int:
        """Context length this request can reach: prompt plus max_tokens."""
        max_tokens = self.params.max_tokens
        assert max_tokens is not None, "LLMEngine.add_request resolves max_tokens=None"
        return len(self.prompt_token_ids) + max_tokens

    @property
    def is_finished(self) -> bool:
        return self.status.is_finished

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)
