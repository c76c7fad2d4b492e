"""`/v1/files`: upload (purpose batch), list, retrieve, content, delete, on the Redis file store
(worker/batch/file_store.py). A tenant sees only its own files: another tenant's id is a 404."""

from __future__ import annotations

import asyncio
from typing import Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.responses import Response

from worker.batch.api_objects import FileObject
from worker.batch.file_store import FileTooLarge
from worker.gateway.auth import tenant_of
from worker.gateway.batch_api import batch_api_of, owner
from worker.gateway.errors import APIError, invalid, too_large

router = APIRouter(prefix="/v1/files")
_CHUNK = 1 << 20


def not_found(file_id: str) -> APIError:
    return APIError(404, f"No such File object: {file_id}", code="file_not_found", param="file_id")


@router.post("")
async def upload(
    request: Request,
    file: UploadFile = File(...),
    purpose: str = Form(...),
    tenant: str | None = Depends(tenant_of),
) -> FileObject:
    if purpose != "batch":
        raise invalid(f"purpose must be 'batch' (the only one this server keeps), got {purpose!r}", "purpose")
    api = batch_api_of(request)
    limit = api.config.max_file_bytes
    content = bytearray()
    while chunk := await file.read(_CHUNK):
        content += chunk
        if len(content) > limit:
            raise too_large(limit)
    try:
        name = file.filename or "upload.jsonl"
        return await asyncio.to_thread(api.files.create, owner(tenant), name, "batch", bytes(content))
    except FileTooLarge:
        raise too_large(limit) from None


@router.get("")
def list_files(
    request: Request,
    purpose: str | None = None,
    limit: int = Query(10000, ge=1, le=10000),
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
    tenant: str | None = Depends(tenant_of),
) -> dict:
    found = batch_api_of(request).files.page(owner(tenant), purpose, limit + 1, order, after)
    return list_page(found[:limit], has_more=len(found) > limit)


@router.get("/{file_id}")
def retrieve(request: Request, file_id: str, tenant: str | None = Depends(tenant_of)) -> FileObject:
    found = batch_api_of(request).files.get(owner(tenant), file_id)
    if found is None:
        raise not_found(file_id)
    return found


@router.get("/{file_id}/content")
def content(request: Request, file_id: str, tenant: str | None = Depends(tenant_of)) -> Response:
    data = batch_api_of(request).files.content(owner(tenant), file_id)
    if data is None:
        raise not_found(file_id)
    return Response(data, media_type="application/octet-stream")


@router.delete("/{file_id}")
def delete(request: Request, file_id: str, tenant: str | None = Depends(tenant_of)) -> dict:
    if not batch_api_of(request).files.delete(owner(tenant), file_id):
        raise not_found(file_id)
    return {"id": file_id, "object": "file", "deleted": True}


def list_page(items: list, has_more: bool) -> dict:
    data = [i.model_dump() for i in items]
    first, last = (data[0]["id"], data[-1]["id"]) if data else (None, None)
    return {"object": "list", "data": data, "first_id": first, "last_id": last, "has_more": has_more}
