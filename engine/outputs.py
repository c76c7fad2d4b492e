"""What the engine hands back: per-step deltas (`step()`) and whole results (`generate()`)."""

from __future__ import annotations

from dataclasses import dataclass, field

# One generated token's log-probabilities: the sampled token first, then the top-k as (token_id, logprob).
TokenLogprobs = list[tuple[int, float]]
# A prompt's log-probabilities, one entry per prompt token: None for the first (nothing predicts it), then
# the prompt token itself first and the top-k as (token_id, logprob), as TokenLogprobs.
PromptLogprobs = list[TokenLogprobs | None]


@dataclass(slots=True)
class StepDelta:
    """What one request (one sample of it) gained in one `step()`. Treat as read-only.

    Not frozen: one is built per running request per step, and a frozen dataclass's __init__ (object.__setattr__
    per field) costs over twice a plain one's, host time every step pays per request. Built in one place,
    LLMEngine._make_delta.
    """

    request_id: str  # the user's id (shared by the samples of an n > 1 request)
    sample_index: int
    new_token_ids: list[int]
    # Text decoded from the new tokens, held back while it could still be part of a stop string or of an
    # unfinished UTF-8 character. The deltas of a sample concatenate to its final text.
    text_delta: str
    # Index of new_token_ids[0] among this sample's generated tokens (counts tokens emitted earlier,
    # including those of a resumed request).
    first_index: int
    logprobs: list[TokenLogprobs] | None = None
    # Parallel to logprobs: each listed token's text piece (engine/token_pieces.py).
    logprob_tokens: list[list[str]] | None = None
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort" when finished
    # params.prompt_logprobs: set once, on the first delta of sample 0 (never on a resumed request's).
    prompt_logprobs: PromptLogprobs | None = None
    # Parallel to prompt_logprobs: each listed token's text piece; the first prompt token (no logprob)
    # lists its own piece only, so the pieces' first column is the prompt token by token.
    prompt_logprob_tokens: list[list[str]] | None = None
    num_prompt_tokens: int = 0
    # Set on the finishing delta: the sample's whole text and token count (prior tokens of a resumed
    # request included).
    text: str | None = None
    num_output_tokens: int = 0
    # Set when the sample ended because of an error (e.g. its grammar failed to compile): the message,
    # and what kind of error (engine.errors.FailureCode's value: "invalid_params" | "internal_error").
    error: str | None = None
    error_code: str | None = None


@dataclass
class CompletionOutput:
    index: int
    token_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: str | None = None
    logprobs: list[TokenLogprobs] | None = None


@dataclass
class RequestOutput:
    request_id: str
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    prompt_logprobs: PromptLogprobs | None = None  # when params.prompt_logprobs is set

    # The first sample's fields, for the common n == 1 case.
    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def finish_reason(self) -> str | None:
        return self.outputs[0].finish_reason

    @property
    def finished(self) -> bool:
        return all(o.finish_reason is not None for o in self.outputs)


@dataclass(frozen=True)
class EngineStats:
    num_running: int
    num_waiting: int
    num_kv_blocks_total: int
    num_kv_blocks_used: int
    num_kv_blocks_free: int
    prefix_cache_queries: int  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: int  # of those, tokens found
    num_preemptions: int
    num_generated_tokens: int
    # Prompt tokens received: the prompts of the requests accepted (once per request, whatever n).
    num_prompt_tokens: int = 0

    @property
    def num_prompt_tokens_computed(self) -> int:
        """Tokens prefilled on admission, prefix-cache hits excluded (re-admissions after preemption count
        again): against `num_prompt_tokens`, what the prefix cache and routing saved."""
        return self.prefix_cache_queries - self.prefix_cache_hits

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Share of the tokens looked up on admission that were found in the prefix cache (0 before any)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries else 0.0
