"""Errors the engine raises to its callers, each refusal with a machine-readable reason."""

from __future__ import annotations

import enum


class RejectReason(str, enum.Enum):
    """Why `add_request` refused a request. Callers map these codes, never the message text."""

    DUPLICATE_ID = "duplicate_id"
    EMPTY_PROMPT = "empty_prompt"
    BAD_TOKEN_IDS = "bad_token_ids"  # prompt or prior output ids outside the vocabulary
    BAD_PRIOR_OUTPUT = "bad_prior_output"  # prior_output_token_ids does not match n
    BAD_MESSAGES = "bad_messages"  # the chat template could not render them
    NO_CHAT_TEMPLATE = "no_chat_template"
    # The prompt alone is over the engine's max_prompt_tokens, or leaves no room for one generated token.
    PROMPT_TOO_LONG = "prompt_too_long"
    # prompt + max_tokens is over max_model_len.
    TOO_LONG_FOR_MODEL = "too_long_for_model"
    # prompt + max_tokens needs more KV blocks than the whole pool holds.
    TOO_LONG_FOR_KV_CACHE = "too_long_for_kv_cache"
    # response_format / structured_outputs the grammar engine refuses (invalid, unsupported, too slow).
    INVALID_CONSTRAINT = "invalid_constraint"


class FailureCode(str, enum.Enum):
    """Why a request that was running ended in an error (StepDelta.error_code)."""

    INVALID_PARAMS = "invalid_params"  # its grammar failed to compile, or rejected a token
    INTERNAL = "internal_error"  # handling it raised (detokenizer, stop strings, logprobs, grammar...)


class RequestRejected(ValueError):
    """A request that can never run (too long for the model or the KV pool, bad token ids...).

    Raised by `add_request`, never after: a rejected request holds no resources and is not retried.
    """

    def __init__(self, reason: RejectReason, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
