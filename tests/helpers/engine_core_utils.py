"""Builders for scheduler tests: plain ints, no model; the test stands in for the runner."""

from __future__ import annotations

from collections.abc import Callable

from engine.config import SchedulerConfig
from engine.core.request import Request
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import RunnerOutput, ScheduledSequence, SchedulerOutput
from engine.sampling_params import SamplingParams

EOS = 2
TOKEN = 7  # a sampled token that stops nothing


def make_scheduler(eos_token_ids: frozenset[int] = frozenset({EOS}), **overrides: object) -> Scheduler:
    config = dict(num_blocks=64, block_size=4, max_num_seqs=16, max_num_batched_tokens=64, max_model_len=256)
    config.update(overrides)
    return Scheduler(SchedulerConfig(**config), eos_token_ids)


def make_request(
    request_id: str,
    prompt: list[int],
    max_tokens: int = 8,
    *,
    arrival: float = 0.0,
    priority: int = 0,
    sample_index: int = 0,
    group_id: str = "",
    output: list[int] | None = None,
    **params: object,
) -> Request:
    if params.get("n", 1) > 1:
        params.setdefault("temperature", 1.0)
    return Request(
        request_id=request_id,
        prompt_token_ids=list(prompt),
        params=SamplingParams(max_tokens=max_tokens, **params),
        arrival_time=arrival,
        priority=priority,
        sample_index=sample_index,
        group_id=group_id,
        output_token_ids=list(output or []),
    )


def make_requests(
    n: int, prompt_len: int, max_tokens: int, *, prefix: str = "r", **params: object
) -> list[Request]:
    """n requests r0..r{n-1} with distinct prompts (no shared prefix), arriving in index order."""
    return [
        make_request(
            f"{prefix}{i}", [100 + 1000 * i + j for j in range(prompt_len)], max_tokens, arrival=i, **params
        )
        for i in range(n)
    ]


def make_group(group_id: str, prompt: list[int], n: int, max_tokens: int = 8, **kw: object) -> list[Request]:
    return [
        make_request(f"{group_id}-{k}", prompt, max_tokens, sample_index=k, group_id=group_id, n=n, **kw)
        for k in range(n)
    ]


def run_step(
    scheduler: Scheduler, sample: Callable[[ScheduledSequence], int] = lambda s: TOKEN
) -> tuple[SchedulerOutput, list[Request]]:
    """One schedule -> fake runner -> update round, checking invariants after it."""
    out = scheduler.schedule()
    sampled = {s.request_id: sample(s) for s in out.sequences if s.sample}
    updated = scheduler.update_from_output(out, RunnerOutput(sampled))
    scheduler.check_invariants()
    return out, updated


def work(out: SchedulerOutput) -> dict[str, int]:
    """request id -> new tokens this step."""
    return {s.request_id: s.num_new_tokens for s in out.sequences}
