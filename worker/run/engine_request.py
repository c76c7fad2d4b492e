"""From a validated job to a request in the engine: its sampling parameters, its prompt, and what an
earlier attempt already published (resumed jobs), or the JobError that refuses it."""

from __future__ import annotations

import structlog
from pydantic import ValidationError

from engine.client import EngineClient
from engine.errors import RequestRejected
from engine.prompt import Chat, Prompt
from engine.sampling_params import SamplingParams
from worker.error_codes import ErrorCode, JobError
from worker.protocol import Job
from worker.run.engine_refusals import job_error

log = structlog.get_logger("conveyor.job")


def start_in_engine(
    engine: EngineClient, job: Job, prior: list[list[int]] | None, max_tokens_cap: int | None
) -> None:
    try:
        params = SamplingParams(**job.sampling_kwargs())
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(map(str, first["loc"])) or "params"
        raise JobError(ErrorCode.INVALID_PARAMS, f"{where}: {first['msg']}", job.id) from None
    try:
        # The engine templates, tokenizes and checks the prompt's length and any response_format /
        # structured_outputs (parsed by the grammar engine: invalid_params); the worker never tokenizes.
        engine.add_request(
            job.id,
            _prompt(job),
            params,
            priority=job.priority,
            prior_output_token_ids=prior,
            max_tokens_cap=max_tokens_cap,  # for max_tokens=None (until the context is full)
        )
    except RequestRejected as rejected:
        raise job_error(rejected, job.id) from None
    except Exception as exc:  # an engine bug must not take the worker down with it
        log.exception("add_request failed", request_id=job.id)
        raise JobError(ErrorCode.INTERNAL, f"{type(exc).__name__}: {exc}", job.id) from None


def _prompt(job: Job) -> Prompt:
    """The job's prompt as the engine takes it: token ids, text, or chat messages (exactly one is set)."""
    if job.prompt_token_ids is not None:
        return list(job.prompt_token_ids)
    if job.messages is not None:
        return Chat([m.model_dump() for m in job.messages])
    assert job.prompt is not None  # the protocol model requires exactly one of the three
    return job.prompt
