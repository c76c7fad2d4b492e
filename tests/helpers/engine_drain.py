"""Step an engine until it is idle, keeping every delta."""

from __future__ import annotations

from engine import LLMEngine
from engine.outputs import StepDelta


def drain(llm: LLMEngine) -> dict[tuple[str, int], list[StepDelta]]:
    """Step until idle; return every delta per (request id, sample)."""
    seen: dict[tuple[str, int], list[StepDelta]] = {}
    while llm.has_unfinished_requests():
        for d in llm.step():
            seen.setdefault((d.request_id, d.sample_index), []).append(d)
    return seen
