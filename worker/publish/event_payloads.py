"""Event payloads as JSON bytes (schema: worker.protocol). Plain json.dumps: this runs per token."""

from __future__ import annotations

import json

from worker.wire.job_record import InFlight


def _dump(obj: dict) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def token_event(delta, n: int) -> bytes:
    """One StepDelta's tokens. `index` counts this sample's tokens from 0 (a resumed job continues it)."""
    event = {
        "type": "token",
        "index": delta.first_index,
        "token_ids": delta.new_token_ids,
        "text": delta.text_delta,
    }
    if n > 1:
        event["sample"] = delta.sample_index
    if delta.logprobs is not None:
        event["logprobs"] = [[list(pair) for pair in per_token] for per_token in delta.logprobs]
        if delta.logprob_tokens is not None:
            event["logprob_tokens"] = delta.logprob_tokens
    if delta.prompt_logprobs is not None:  # once per job: on sample 0's first event, written with it
        event["prompt_logprobs"] = [
            None if entry is None else [list(pair) for pair in entry] for entry in delta.prompt_logprobs
        ]
        event["prompt_logprob_tokens"] = delta.prompt_logprob_tokens
    return _dump(event)


def done_event(job: InFlight, now_ms: float) -> bytes:
    samples = [job.finished[k] for k in range(job.n)]
    reason, text = samples[0].finish_reason, samples[0].text
    event = {
        "type": "done",
        "finish_reason": reason,
        "text": text,
        "usage": {
            "prompt_tokens": job.prompt_tokens,
            "completion_tokens": sum(s.num_output_tokens for s in samples),
        },
        "timing": {
            "queue_ms": round(job.admitted_ms - job.enqueued_ms, 3),
            "ttft_ms": None if job.first_token_ms is None else round(job.first_token_ms - job.enqueued_ms, 3),
            "total_ms": round(now_ms - job.enqueued_ms, 3),
        },
    }
    if job.stop_reason is not None and reason == "abort":
        event["reason"] = job.stop_reason
    if job.n > 1:
        event["texts"] = [s.text for s in samples]
        event["finish_reasons"] = [s.finish_reason for s in samples]
    return _dump(event)


def error_event(code: str, message: str) -> bytes:
    return _dump({"type": "error", "code": code, "message": message[:2000]})
