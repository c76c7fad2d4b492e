"""The wire schema, version 1: jobs in, events out. docs/protocol.md describes the same models in prose.

The worker builds event payloads with plain `json.dumps` on the hot path (see
publish/event_payloads.py); these models are the contract those payloads are tested against, and what
the gateway and the batch runner parse them with (`parse_event`, `read_event`).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, model_validator

from worker.error_codes import ErrorCode

PROTOCOL_VERSION = 1
JOB_ID_PATTERN = r"^[A-Za-z0-9._:-]{1,128}$"
TENANT_PATTERN = r"^[A-Za-z0-9._-]{1,64}$"  # no ':' or braces: a tenant may name a key or a lane

# Sampling fields a job may carry, under the engine's names (engine.sampling_params.SamplingParams).
SAMPLING_FIELDS = (
    "n",
    "max_tokens",
    "min_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "repetition_penalty",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "prompt_logprobs",
    "response_format",
    "structured_outputs",
)


class ChatTurn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    role: str = Field(max_length=64)
    content: str


class Job(BaseModel):
    """One request, the JSON in the `job` field of an entry on the requests stream."""

    model_config = ConfigDict(extra="forbid", strict=True)

    v: Literal[1] = 1
    id: str = Field(pattern=JOB_ID_PATTERN)
    prompt: str | None = None
    prompt_token_ids: list[Annotated[int, Field(ge=0)]] | None = None
    messages: list[ChatTurn] | None = None
    priority: int = Field(0, ge=-(2**31), lt=2**31)
    deadline_ms: int | None = Field(None, ge=0)
    # Who the job is for (accounting and fair share, docs/protocol.md); the HTTP gateway sets it from the API key.
    tenant: str | None = Field(None, pattern=TENANT_PATTERN)
    # Jobs with the same key share a prompt prefix: routed to the same workers (prefix affinity).
    affinity: str | None = Field(None, min_length=1, max_length=128)
    # Sampling parameters: None means "the engine's default". Range checks are the engine's (SamplingParams).
    n: int | None = None
    # Absent: the engine's default (16). An explicit null: until the context is full (capped by the
    # worker's --max-tokens-limit when set, see worker/run/engine_request.py).
    max_tokens: int | None = None
    min_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    logprobs: int | None = None
    # Logprobs of the prompt's own tokens (vLLM's prompt_logprobs): published once, on sample 0's first
    # token event (TokenEvent.prompt_logprobs).
    prompt_logprobs: int | None = None
    # Constrained decoding, as OpenAI (`response_format`) or vLLM (`structured_outputs`) write it; the engine
    # validates both (engine/structured/spec.py) and the grammar engine checks the schema/regex/grammar.
    response_format: dict | None = None
    structured_outputs: dict | None = None

    @model_validator(mode="after")
    def _one_prompt(self) -> Job:
        given = [
            name for name in ("prompt", "prompt_token_ids", "messages") if getattr(self, name) is not None
        ]
        if len(given) != 1:
            raise ValueError(
                f"exactly one of prompt, prompt_token_ids, messages is required (got {given or 'none'})"
            )
        return self

    def wire(self) -> dict:
        """The job as a client writes it to a stream: the fields given, an explicit null kept."""
        return self.model_dump(exclude_unset=True)

    def sampling_kwargs(self) -> dict:
        kwargs = {name: getattr(self, name) for name in SAMPLING_FIELDS if getattr(self, name) is not None}
        if self.max_tokens is None and "max_tokens" in self.model_fields_set:
            kwargs["max_tokens"] = None  # an explicit null: until the model's context is full
        return kwargs


class TokenEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["token"]
    index: int  # of token_ids[0] among this sample's generated tokens, from 0
    token_ids: list[int]
    text: str
    sample: int | None = None  # present when n > 1
    # Per token: [[sampled_id, logprob], [top_id, logprob], ...]
    logprobs: list[list[tuple[int, float]]] | None = None
    # Parallel to logprobs: each listed token's text piece, as the model's tokenizer decodes it alone.
    logprob_tokens: list[list[str]] | None = None
    # Only on sample 0's first token event of a job that asked (prompt_logprobs): per prompt token, null for
    # the first, then [[prompt_id, logprob], [top_id, logprob], ...].
    prompt_logprobs: list[list[tuple[int, float]] | None] | None = None
    # Parallel to prompt_logprobs: each listed token's text piece; the first prompt token lists its own.
    prompt_logprob_tokens: list[list[str]] | None = None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int


class Timing(BaseModel):
    queue_ms: float  # enqueue (the entry id's time) -> admitted to the engine
    ttft_ms: float | None  # enqueue -> first token event written
    total_ms: float  # enqueue -> terminal event written


class DoneEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["done"]
    finish_reason: Literal["stop", "length", "abort"]
    text: str
    usage: Usage
    timing: Timing
    reason: Literal["cancel", "deadline"] | None = None  # why an aborted job stopped
    # n > 1: per sample, in sample order (text/finish_reason above are sample 0's).
    texts: list[str] | None = None
    finish_reasons: list[str] | None = None


class ErrorEvent(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["error"]
    code: str
    message: str


Event = TokenEvent | DoneEvent | ErrorEvent
_EVENT: TypeAdapter[Event] = TypeAdapter(Annotated[Event, Field(discriminator="type")])
TERMINAL = ("done", "error")  # the event types that end an output stream
# What stands for an entry that is not an event (no worker writes one): a 500 internal_error.
NOT_AN_EVENT = ErrorEvent(type="error", code=ErrorCode.INTERNAL.value, message="an entry is not an event")


def parse_event(raw: bytes | str) -> Event:
    """Parse one event payload (the `event` field of an output stream entry or a pub/sub message);
    pydantic.ValidationError for one that is not an event of this schema (not JSON, no known type...)."""
    return _EVENT.validate_json(raw)


def read_event(raw: object) -> Event:
    """An output stream entry's event, or NOT_AN_EVENT for whatever is not one: an entry is data, and
    nothing in it may stop a reader that serves other jobs too."""
    try:
        return parse_event(raw)  # type: ignore[arg-type]  # not bytes: refused as not an event
    except Exception:  # noqa: BLE001
        return NOT_AN_EVENT
