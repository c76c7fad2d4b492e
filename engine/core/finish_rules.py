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
    params = request.params
    num_out = request.num_output_tokens
    if num_out >= params.min_tokens:
        if token_id in eos_token_ids and not params.ignore_eos:
            return RequestStatus.FINISHED_STOPPED
        if token_id in params.stop_token_ids:
            return RequestStatus.FINISHED_STOPPED
    if (
        params.max_tokens is not None and num_out >= params.max_tokens
    ) or request.num_tokens >= max_model_len:
        return RequestStatus.FINISHED_LENGTH
    return None
