"""`EngineClient`: everything the worker uses of an engine, and nothing more.

`LLMEngine` satisfies it; so does the worker tests' fake engine (checked by
tests/engine/test_engine_client.py). The worker codes against this protocol, never against LLMEngine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from engine.outputs import EngineStats, StepDelta
from engine.prompt import Prompt
from engine.sampling_params import SamplingParams


class EngineClient(Protocol):
    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        prior_output_token_ids: Sequence[Sequence[int]] | None = None,
        arrival_time: float | None = None,
        max_tokens_cap: int | None = None,
    ) -> int:
        """Queue a request (templating and tokenizing it); return its number of prompt tokens.

        Raises `engine.errors.RequestRejected` (with a `RejectReason`) if it can never run; then nothing of
        it is kept. `prior_output_token_ids` (one list per sample) resumes a request started elsewhere.
        `params.max_tokens=None`: until the context is full, at most `max_tokens_cap` tokens when given.
        """
        ...

    def step(self) -> list[StepDelta]:
        """One iteration: what each sequence produced (and the final delta of every finished one)."""
        ...

    def abort(self, request_id: str) -> bool:
        """Stop a request; its samples finish with "abort" at the next step. False if it is unknown."""
        ...

    def has_unfinished_requests(self) -> bool: ...

    def stats(self) -> EngineStats: ...

    def step_tokens(self) -> dict[str, int]:
        """Tokens computed by the last `step()` per request id (prefill and decode): what its wall time is
        split by for accounting (worker/fleet/accounting.py)."""
        ...

    def free_capacity(self) -> tuple[int, int]:
        """(free sequence slots, free KV blocks): how much new work the engine can take at once."""
        ...

    def kv_waste(self) -> tuple[int, int]:
        """(allocated but unwritten KV slots, allocated KV slots) over the running sequences now: what the
        paged cache holds back for tokens not yet written (O(blocks held): read it at a metrics interval)."""
        ...
