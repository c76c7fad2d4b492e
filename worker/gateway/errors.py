"""OpenAI's error object, `{"error": {"message", "type", "param", "code"}}`, for every answer that is not a 2xx.

Raise `APIError` (or one of the helpers below) anywhere in a route; the handlers installed by `install`
write it, and also turn FastAPI's own errors (a body that does not validate, an unknown path) into the
same shape, so OpenAI's SDKs raise their matching exception class for each. Worker error codes map to a
status through worker/error_codes.py's one table.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from worker.error_codes import http_status


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, code=code, param=param)


def unauthorized(message: str) -> APIError:
    return APIError(401, message, type="authentication_error", code="invalid_api_key")


def model_not_found(model: str) -> APIError:
    return APIError(404, f"The model `{model}` does not exist.", code="model_not_found", param="model")


def too_large(limit: int) -> APIError:
    return APIError(413, f"request body over {limit} bytes", code="payload_too_large")


def queue_full(model: str, queued: int, retry_after_s: int) -> APIError:
    return APIError(
        429,
        f"{queued} requests are queued for {model}, over this gateway's limit; retry later",
        type="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": str(retry_after_s)},
    )


def no_worker(model: str) -> APIError:
    return APIError(503, f"no live worker serves {model}", type="server_error", code="no_live_worker")


def timed_out(seconds: float) -> APIError:
    return APIError(504, f"the request took longer than {seconds:g}s", type="timeout_error", code="timeout")


def from_worker(code: str, message: str) -> APIError:
    """A worker's error event (docs/protocol.md's codes) as an answer."""
    status, type_ = http_status(code)
    return APIError(status, message, type=type_, code=code)


def install(app: FastAPI) -> None:
    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return exc.response()

    @app.exception_handler(RequestValidationError)
    async def _invalid_body(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = [str(p) for p in first.get("loc", ()) if p != "body"]
        message = f"{'.'.join(where) or 'body'}: {first.get('msg', 'invalid request')}"
        return invalid(message, param=".".join(where) or None).response()

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        type_ = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = "not_found" if exc.status_code == 404 else None
        return APIError(exc.status_code, str(exc.detail), type=type_, code=code).response()
