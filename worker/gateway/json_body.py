"""A request's JSON body, read by worker/strict_json.py (nesting at most MAX_JSON_DEPTH, no key twice, no
lone surrogate): a body it refuses is 400 `invalid_json` in OpenAI's error object, never the RecursionError
of the parser FastAPI would use."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from worker.gateway.errors import invalid
from worker.strict_json import JSONRefused, loads_strict

M = TypeVar("M", bound=BaseModel)


async def read_body(request: Request) -> dict[str, Any]:
    try:
        body = loads_strict(await request.body())
    except JSONRefused as exc:
        raise invalid(f"the body: {exc}", code="invalid_json") from None
    if not isinstance(body, dict):
        raise invalid("the body must be a JSON object")
    return body


def body_as(model: type[M]) -> Callable[[Request], Awaitable[M]]:
    """A dependency: the body as `model`; what does not validate is FastAPI's own 400 (errors.py)."""

    async def parsed(request: Request) -> M:
        try:
            return model.model_validate(await read_body(request))
        except ValidationError as exc:
            raise RequestValidationError(exc.errors(include_url=False)) from None

    return parsed
