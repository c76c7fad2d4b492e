"""Per-request sampling parameters, validated once when a request is made."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from engine.structured.spec import GrammarSpec, ResponseFormat, StructuredOutputs


class SamplingParams(BaseModel):
    """How to pick each next token of one request.

    Names follow vLLM's so that clients can move between the two. Every field is validated here;
    an invalid value raises `pydantic.ValidationError` naming the field.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    n: int = Field(1, ge=1, le=64)
    # None: until the context is full (the engine resolves it to max_model_len minus the prompt on add_request).
    max_tokens: int | None = Field(16, ge=1)
    min_tokens: int = Field(0, ge=0)
    # temperature 0 means greedy; below 1e-5 is treated as 0 as well.
    temperature: float = Field(1.0, ge=0.0, le=100.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    # 0 or -1 disables top-k.
    top_k: int = Field(0, ge=-1)
    min_p: float = Field(0.0, ge=0.0, le=1.0)
    repetition_penalty: float = Field(1.0, gt=0.0, le=100.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    seed: int | None = Field(None, ge=0, lt=2**63)
    stop: list[str] = Field(default_factory=list, max_length=16)
    stop_token_ids: list[int] = Field(default_factory=list, max_length=64)
    ignore_eos: bool = False
    # Number of top log-probabilities to return per generated token (the sampled one is always included).
    logprobs: int | None = Field(None, ge=0, le=20)
    # Log-probabilities of the prompt's own tokens (vLLM's name): 0 gives each prompt token's logprob, k > 0
    # the top-k at each position as well. The first prompt token has none (None). Such a request does not
    # read the prefix cache (a cached prefix has no logits), as in vLLM; it still fills it for others.
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    # Constrained decoding (engine/structured/): OpenAI's response_format or vLLM's structured_outputs, not both.
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = Field(None, validate_default=True)

    @field_validator("stop", mode="before")
    @classmethod
    def _stop_as_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value

    @field_validator("stop")
    @classmethod
    def _stop_not_empty(cls, value: list[str]) -> list[str]:
        if any(s == "" for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @field_validator("stop_token_ids")
    @classmethod
    def _ids_non_negative(cls, value: list[int]) -> list[int]:
        if any(t < 0 for t in value):
            raise ValueError("token ids must be >= 0")
        return value

    # Cross-field checks are field validators on the later field (fields validate in declaration order, so
    # `info.data` holds the earlier ones) so that the ValidationError names a field; a model validator's has loc ().
    @field_validator("min_tokens")
    @classmethod
    def _min_le_max(cls, value: int, info: ValidationInfo) -> int:
        max_tokens = info.data.get("max_tokens")
        if max_tokens is not None and value > max_tokens:
            raise ValueError(f"min_tokens ({value}) must not exceed max_tokens ({max_tokens})")
        return value

    @field_validator("temperature")
    @classmethod
    def _n_needs_sampling(cls, value: float, info: ValidationInfo) -> float:
        if info.data.get("n", 1) > 1 and value < 1e-5:
            # n greedy samples would all be identical: almost certainly a mistake.
            raise ValueError("n > 1 needs temperature > 0 (greedy samples would all be the same)")
        return value

    @field_validator("structured_outputs")
    @classmethod
    def _one_constraint(
        cls, value: StructuredOutputs | None, info: ValidationInfo
    ) -> StructuredOutputs | None:
        fmt = info.data.get("response_format")
        fmt_constrains = fmt is not None and fmt.type != "text"
        if value is not None and fmt_constrains:
            raise ValueError("give response_format or structured_outputs, not both")
        if value is not None or fmt_constrains:
            # The grammar allows EOS only where the output may end, and then only EOS: a banned or ignored
            # EOS would leave no token to sample.
            if info.data.get("min_tokens"):
                raise ValueError("min_tokens cannot be combined with a structured output")
            if info.data.get("ignore_eos"):
                raise ValueError("ignore_eos cannot be combined with a structured output")
        return value

    @property
    def grammar_spec(self) -> GrammarSpec | None:
        """The output constraint, or None for free text."""
        if self.structured_outputs is not None:
            return self.structured_outputs.grammar_spec()
        return self.response_format.grammar_spec() if self.response_format is not None else None

    @property
    def is_greedy(self) -> bool:
        return self.temperature < 1e-5
