"""The model runner's own copy of a request (vLLM V1's CachedRequestState): made from the scheduler's
`NewRequest` once, then grown by the runner's own sampled ids. Plain lists, no torch.

`SamplingRequest` is what the sampler reads from a row: this state, or (in the sampler's own tests) a
scheduler `Request`, which has the same fields.
"""

from __future__ import annotations

from typing import Protocol

from engine.core.scheduler_output import NewRequest
from engine.sampling_params import SamplingParams


class SamplingRequest(Protocol):
    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    sample_index: int

    def token_ids(self) -> list[int]: ...

    @property
    def num_tokens(self) -> int: ...


class RequestState:
    """prompt + the outputs the runner knows; `token_ids()` is the two as one list, extended in place."""

    __slots__ = ("request_id", "prompt_token_ids", "output_token_ids", "params", "sample_index", "_tokens")

    def __init__(self, new: NewRequest) -> None:
        self.request_id = new.request_id
        self.prompt_token_ids = new.prompt_token_ids
        self.output_token_ids = list(new.output_token_ids)
        self.params = new.params
        self.sample_index = new.sample_index
        self._tokens = self.prompt_token_ids + self.output_token_ids

    def token_ids(self) -> list[int]:
        """prompt + output (do not mutate)."""
        return self._tokens

    def append(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._tokens.append(token_id)

    @property
    def num_tokens(self) -> int:
        return len(self._tokens)
