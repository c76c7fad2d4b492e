"""`/v1/batches`: create, list, retrieve, cancel, on the Redis batch store (worker/batch/batch_store.py); the
replicas' drivers (worker/batch/driver.py) run them. A tenant sees only its own batches."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Query, Request
from pydantic import BaseModel, ConfigDict, Field

from worker.batch.api_objects import CANCELLABLE_STATUSES, BatchObject
from worker.batch.batch_store import BadWindow, window_seconds
from worker.gateway.auth import tenant_of
from worker.gateway.batch_api import batch_api_of, owner
from worker.gateway.errors import APIError, invalid
from worker.gateway.files_api import list_page
from worker.gateway.json_body import body_as
from worker.openai.request import CHAT_URL, COMPLETIONS_URL

router = APIRouter(prefix="/v1/batches")


class CreateBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")
    input_file_id: str
    endpoint: str
    completion_window: str = "24h"
    metadata: dict[str, str] | None = Field(None, max_length=16)
    output_expires_after: dict | None = None  # accepted; files here do not expire


def not_found(batch_id: str) -> APIError:
    return APIError(404, f"No such Batch object: {batch_id}", code="batch_not_found", param="batch_id")


@router.post("")
def create(
    request: Request,
    body: CreateBatch = Depends(body_as(CreateBatch)),
    tenant: str | None = Depends(tenant_of),
) -> BatchObject:
    if body.endpoint not in (CHAT_URL, COMPLETIONS_URL):
        raise invalid(f"endpoint must be {CHAT_URL} or {COMPLETIONS_URL}, got {body.endpoint!r}", "endpoint")
    try:
        window_seconds(body.completion_window)
    except BadWindow as exc:
        raise invalid(str(exc), "completion_window") from None
    api = batch_api_of(request)
    found = api.files.get(owner(tenant), body.input_file_id)
    if found is None:
        raise APIError(
            404, f"No such File object: {body.input_file_id}", code="file_not_found", param="input_file_id"
        )
    if found.purpose != "batch":
        raise invalid(f"file {found.id} has purpose {found.purpose!r}, not 'batch'", "input_file_id")
    return api.batches.create(
        owner(tenant),
        body.input_file_id,
        body.endpoint,
        body.completion_window,
        body.metadata,
        tenant is not None,
    )


@router.get("")
def list_batches(
    request: Request,
    limit: int = Query(20, ge=1, le=100),
    after: str | None = None,
    tenant: str | None = Depends(tenant_of),
) -> dict:
    found = batch_api_of(request).batches.page(owner(tenant), limit + 1, after)
    return list_page(found[:limit], has_more=len(found) > limit)


@router.get("/{batch_id}")
def retrieve(request: Request, batch_id: str, tenant: str | None = Depends(tenant_of)) -> BatchObject:
    found = batch_api_of(request).batches.get(owner(tenant), batch_id)
    if found is None:
        raise not_found(batch_id)
    return found


@router.post("/{batch_id}/cancel")
def cancel(request: Request, batch_id: str, tenant: str | None = Depends(tenant_of)) -> BatchObject:
    found = batch_api_of(request).batches.cancel(owner(tenant), batch_id)
    if found is None:
        raise not_found(batch_id)
    # Cancelling again while cancelling is the same request; a final batch (cancelled too) is 409.
    if found.status not in CANCELLABLE_STATUSES | {"cancelling"}:
        raise APIError(
            409, f"batch {batch_id} is {found.status}: it cannot be cancelled", code="batch_not_cancellable"
        )
    return found
