"""A chat or completions request body (OpenAI's fields) -> a validated protocol.Job, or the reason it
cannot run. The gateway maps each request so, and the Batch API each line's body.

Body fields map to job fields under the names of docs/protocol.md. A field that Conveyor cannot honour
(tools, logit_bias, streaming, several prompts...) fails the request, never silently changes its meaning.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from worker.openai.echo import Echo, EchoError, take_echo
from worker.protocol import Job

CHAT_URL, COMPLETIONS_URL = "/v1/chat/completions", "/v1/completions"

# Same name and meaning in the body and in a job.
_SHARED = (
    "n",
    "temperature",
    "top_p",
    "seed",
    "stop",
    "presence_penalty",
    "frequency_penalty",
    # vLLM's extensions to the OpenAI bodies
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "structured_outputs",
)
# Accepted and ignored: they change nothing about the tokens (the model is whatever the workers serve).
_IGNORED = ("model", "user", "metadata", "store", "service_tier", "stream_options", "parallel_tool_calls")
_OFF_OR_ABSENT = {"stream": False, "echo": False, "tools": None, "functions": None}
# OpenAI's chat roles -> the role the chat template is given: "developer" is OpenAI's newer name for
# "system", which is the one the models' templates know.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}


class RequestError(ValueError):
    """The body cannot become a job. `code`: OpenAI's error code (a 400 from the gateway, a Batch error
    line's `error.code`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


@dataclass(frozen=True)
class CompletionRequest:
    url: str  # CHAT_URL or COMPLETIONS_URL: which shape the answer takes
    job: Job
    model: str | None  # the body's, echoed in the answer
    echo: Echo | None = None  # a completions body's echo / prompt_logprobs (echo.py)


def completion_request(
    url: str, body: Mapping[str, Any], job_id: str, fields: Mapping[str, Any] | None = None
) -> CompletionRequest:
    """The request's job, named `job_id`, with `fields` (tenant, deadline_ms) set. Raises RequestError
    naming a field that cannot be honoured, or one the job refuses (code invalid_job)."""
    body = dict(body)
    job: dict = {"id": job_id}
    echo = None
    if url == CHAT_URL:
        job["messages"] = _messages(body.pop("messages", None))
        _tokens_limit(body, job, "max_completion_tokens", "max_tokens")
        _chat_logprobs(body, job)
    else:
        job.update(_prompt(body.pop("prompt", None)))
        _tokens_limit(body, job, "max_tokens")
        top = body.pop("logprobs", None)
        if top is not None:
            job["logprobs"] = _top_count(top, "logprobs")
        best_of = body.pop("best_of", None)
        if best_of is not None and best_of != body.get("n", 1):
            raise RequestError("unsupported_field", "best_of other than n is not supported")
        try:
            echo = take_echo(body, job)
        except EchoError as exc:
            raise RequestError("invalid_request", str(exc)) from None
    if "response_format" in body:
        job["response_format"] = body.pop("response_format")
    for name in _SHARED:
        if name in body:
            job[name] = body.pop(name)
    model = body.pop("model", None)
    for name in _IGNORED:
        body.pop(name, None)
    for name, allowed in _OFF_OR_ABSENT.items():
        if name in body and body.pop(name) not in (allowed, None):
            raise RequestError("unsupported_field", f"{name} is not supported")
    if body:
        raise RequestError("unsupported_field", f"fields not supported: {', '.join(sorted(body))}")
    job.update(fields or {})
    return CompletionRequest(url, _validated(job), model if isinstance(model, str) else None, echo)


def _validated(job: dict) -> Job:
    """The job as the worker would read it; its first complaint, named, when it would refuse it."""
    try:
        return Job.model_validate(job)
    except ValidationError as exc:
        wrong = exc.errors()[0]
        raise RequestError("invalid_job", f"{'.'.join(map(str, wrong['loc']))}: {wrong['msg']}") from None


def _tokens_limit(body: dict, job: dict, *names: str) -> None:
    """OpenAI's default is "up to the model's context": an explicit null max_tokens in the job means the same
    (capped by the worker's --max-tokens-limit), rather than the engine's default of 16 tokens."""
    values = [body.pop(n) for n in names if body.get(n) is not None]
    job["max_tokens"] = values[0] if values else None
    for n in names:
        body.pop(n, None)


def _chat_logprobs(body: dict, job: dict) -> None:
    """Chat asks with `logprobs: true` and `top_logprobs: k`; a job with `logprobs: k`."""
    wanted, top = body.pop("logprobs", None), body.pop("top_logprobs", None)
    if wanted not in (None, True, False):
        raise RequestError("invalid_request", "logprobs must be a boolean")
    if top is not None and not wanted:
        raise RequestError("invalid_request", "top_logprobs needs logprobs: true")
    if wanted:
        job["logprobs"] = 0 if top is None else _top_count(top, "top_logprobs")


def _top_count(value: object, name: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 20:
        raise RequestError("invalid_request", f"{name} must be an integer from 0 to 20")
    return value


def _messages(messages: object) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise RequestError("invalid_request", "messages must be a non-empty list")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise RequestError("invalid_request", "each message needs a role")
        role = ROLES.get(m["role"])
        if role is None:  # a chat template would render any role into the prompt as given
            raise RequestError(
                "invalid_request",
                f"messages.{k}.role must be one of {', '.join(ROLES)}, got {m['role'][:32]!r}",
            )
        extra = set(m) - {"role", "content", "name"}
        if extra:
            raise RequestError(
                "unsupported_field", f"message fields not supported: {', '.join(sorted(extra))}"
            )
        out.append({"role": role, "content": _content(m.get("content"))})
    return out


def _content(content: object) -> str:
    """A string, or a list of text parts (joined); images, audio and files cannot be honoured."""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(p, dict) and p.get("type") == "text" for p in content):
        return "".join(str(p.get("text", "")) for p in content)
    raise RequestError("unsupported_field", "message content must be text")


def _prompt(prompt: object) -> dict:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    if isinstance(prompt, str) and prompt:
        return {"prompt": prompt}
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return {"prompt_token_ids": prompt}
    raise RequestError("invalid_request", "prompt must be one non-empty string or one list of token ids")
