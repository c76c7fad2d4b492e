"""`POST /v1/chat/completions` and `/v1/completions`: an OpenAI request becomes a job on its model's stream,
and the job's output stream becomes the answer (one body, or SSE chunks with `stream: true`).

The status is sent with the first event, so a job the worker refuses (invalid parameters, a prompt too
long) is an HTTP error with its status even when streamed (worker/gateway/sse.py). A client that leaves
cancels its job; the job carries a deadline of --request-timeout, so a worker stops it then (504).
"""

from __future__ import annotations

import asyncio
import re
import time
import uuid

import structlog
from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from worker.gateway import job_io
from worker.gateway.auth import tenant_of
from worker.gateway.chunks import ChunkEncoder
from worker.gateway.disconnect import ClientLeft, unless_disconnected
from worker.gateway.errors import APIError, from_worker, invalid, model_not_found, no_worker, timed_out
from worker.gateway.json_body import read_body
from worker.gateway.sse import EventStream
from worker.gateway.state import keys_of, redis_of, settings_of
from worker.keys import requests_stream_name
from worker.openai.echo import prompt_scores
from worker.openai.logprobs import SampleLogprobs
from worker.openai.request import (
    CHAT_URL,
    COMPLETIONS_URL,
    CompletionRequest,
    RequestError,
    completion_request,
)
from worker.openai.response import finish_reasons, response_body
from worker.protocol import JOB_ID_PATTERN, DoneEvent, ErrorEvent, Event, TokenEvent

router = APIRouter()
log = structlog.get_logger("conveyor.gateway")
GRACE_S = 2.0  # past the job's deadline, how long the worker has to write its terminal event


@router.post("/v1/chat/completions")
async def chat_completions(request: Request, tenant: str | None = Depends(tenant_of)) -> Response:
    return await complete(request, CHAT_URL, tenant)


@router.post("/v1/completions")
async def completions(request: Request, tenant: str | None = Depends(tenant_of)) -> Response:
    return await complete(request, COMPLETIONS_URL, tenant)


def job_id_for(request: Request, tenant: str | None) -> str:
    """A valid X-Request-Id is the job id (under the tenant's name when keys are in use, so one tenant
    cannot read another's job by naming it); otherwise a random one."""
    given = request.headers.get("x-request-id")
    if given and re.match(JOB_ID_PATTERN, job_id := f"{tenant}:{given}" if tenant else given):
        return job_id
    return uuid.uuid4().hex


async def complete(request: Request, url: str, tenant: str | None) -> Response:
    settings, client, keys = settings_of(request), redis_of(request), keys_of(request)
    body = await read_body(request)
    stream, options = body.pop("stream", False), body.pop("stream_options", None)
    if not isinstance(stream, bool) and stream is not None:
        raise invalid("stream must be a boolean", param="stream")
    if options is not None and (not stream or not isinstance(options, dict)):
        raise invalid("stream_options is only allowed with stream: true", param="stream_options")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("model is required", param="model")
    job_id = job_id_for(request, tenant)
    fields: dict[str, object] = {"deadline_ms": int((time.time() + settings.request_timeout_s) * 1000)}
    if tenant is not None:
        fields["tenant"] = tenant
    try:
        asked = completion_request(url, body, job_id, fields)
    except RequestError as exc:
        raise invalid(exc.message, code=exc.code) from None
    served = (await request.app.state.fleet.models()).get(model)
    if served is None:
        served = (await request.app.state.fleet.models(fresh=True)).get(model)
    if served is None:
        raise await _missing(request, model)
    stream_name = await job_io.submit(
        client,
        keys,
        served,
        asked.job,
        settings.max_queued,
        settings.retry_after_s,
        request.app.state.xadds.xadd,
    )
    job_keys = job_io.keys_of_stream(keys, stream_name)

    events, headers = request.app.state.hub, {"x-request-id": job_id}

    async def cancel() -> None:
        """Called once this request no longer follows the job; another with the same X-Request-Id may."""
        if events.followed(job_keys, job_id):
            log.info("answer abandoned: job kept for another request", request_id=job_id)
            return
        log.info("answer abandoned: job cancelled", request_id=job_id)
        await job_io.cancel(client, job_keys, job_id, sharded=settings.cluster)

    deadline = asyncio.get_running_loop().time() + settings.request_timeout_s + GRACE_S
    if stream:
        include_usage = bool((options or {}).get("include_usage"))
        n = asked.job.n or 1
        encoder = ChunkEncoder(
            url, job_id, model, n, include_usage, settings.request_timeout_s, echo=asked.echo
        )
        return EventStream(encoder, events, job_keys, deadline, headers, cancel)
    batches = events.follow(job_keys, job_id, deadline)
    try:
        found = await unless_disconnected(request.receive, _rest(batches))
        answer = _answer(asked, model, found, settings.request_timeout_s)
    except TimeoutError:
        await batches.aclose()  # before cancel(), which asks whether another request follows the job
        await cancel()
        late = timed_out(settings.request_timeout_s)
        late.headers.update(headers)
        raise late from None
    except ClientLeft:
        await batches.aclose()
        await cancel()
        return Response(status_code=499)  # nobody reads it
    except APIError as exc:
        exc.headers.update(headers)
        raise
    finally:
        await batches.aclose()
    return JSONResponse(answer, headers=headers)


async def _rest(batches) -> list[Event]:
    return [event async for batch in batches for event in batch]


def _answer(asked: CompletionRequest, model: str, events: list[Event], timeout_s: float) -> dict:
    end = events[-1]
    if isinstance(end, ErrorEvent):
        raise from_worker(end.code, end.message)
    assert isinstance(end, DoneEvent)  # follow ends at a terminal event
    if "abort" in finish_reasons(end):
        if end.reason == "deadline":
            raise timed_out(timeout_s)
        raise APIError(500, f"the job was stopped ({end.reason})", type="server_error", code=end.reason)
    logprobs: dict[int, SampleLogprobs] | None = None
    if asked.job.logprobs is not None:
        logprobs = {}
        for event in events[:-1]:
            if isinstance(event, TokenEvent):
                logprobs.setdefault(event.sample or 0, SampleLogprobs()).add(event)
    prompt = prompt_scores(events) if asked.echo is not None else None
    return response_body(asked.url, model, asked.job.id, end, logprobs, asked.echo, prompt)


async def _missing(request: Request, model: str) -> APIError:
    """404 for a model nobody serves; 503 for one whose workers are all gone (its stream is still there,
    or no worker at all is live, so nothing can be said about the name)."""
    fleet = await request.app.state.fleet.models()
    stream = requests_stream_name(keys_of(request).prefix, model)
    if not fleet or await redis_of(request).exists(stream):
        return no_worker(model)
    return model_not_found(model)
