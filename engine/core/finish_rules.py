"""When a sequence is done after appending one sampled token."""

from __future__ import annotations

from collections.abc import Collection

from engine.core.request import Request, RequestStatus


def check_stop(
    request: Request, token_id: int, eos_token_ids: Collection[int], max_model_len: int
) -> RequestStatus | None:
    """The finished status for `request` whose last output is `token_id`, or None to continue.

    A stop token wins over a length limit reached by the same token, so the reason names the stronger cause.
    """
    # Runs once per running request per step: plain attribute reads, no property calls.
    params = request.params
    num_out = len(request.output_token_ids)
    if num_out >= params.min_tokens and (
        (token_id in eos_token_ids and not params.ignore_eos) or token_id in params.stop_token_ids
    ):
        return RequestStatus.FINISHED_STOPPED
    max_tokens = params.max_tokens
    if (max_tokens is not None and num_out >= max_tokens) or len(
        request.prompt_token_ids
    ) + num_out >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None


class StopTriggers:
    """When check_stop can answer something other than None, computed once per request: only after a token
    in `token_ids`, or once the output reaches `num_outputs` tokens. The scheduler tests these two (a set
    lookup and a comparison) each decode step and calls check_stop, the rule itself, only when one holds."""

    __slots__ = ("num_outputs", "token_ids")

    def __init__(self, request: Request, eos_token_ids: Collection[int], max_model_len: int) -> None:
        params = request.params
        ids = set(params.stop_token_ids)
        if not params.ignore_eos:
            ids.update(eos_token_ids)
        self.token_ids = frozenset(ids)
        limit = max_model_len - len(request.prompt_token_ids)
        if params.max_tokens is not None:
            limit = min(limit, params.max_tokens)
        self.num_outputs = limit
