"""OpenAI's File and Batch objects, as the HTTP API returns them (the `openai` SDK's types parse them).

The stores (file_store.py, batch_store.py) keep these in Redis with the owning tenant beside them; the
tenant never goes out on the wire.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

FilePurpose = Literal["batch", "batch_output"]
BatchStatus = Literal[
    "validating", "failed", "in_progress", "finalizing", "completed", "expired", "cancelling", "cancelled"
]
FINAL_STATUSES = frozenset({"failed", "completed", "expired", "cancelled"})
CANCELLABLE_STATUSES = frozenset({"validating", "in_progress"})


class FileObject(BaseModel):
    id: str
    object: Literal["file"] = "file"
    bytes: int
    created_at: int  # epoch seconds
    filename: str
    purpose: FilePurpose
    status: Literal["processed"] = "processed"  # deprecated by OpenAI, still required by its SDK's type
    status_details: str | None = None
    expires_at: int | None = None


class RequestCounts(BaseModel):
    total: int = 0
    completed: int = 0
    failed: int = 0


class BatchError(BaseModel):
    code: str
    message: str
    param: str | None = None
    line: int | None = None  # 1-based line of the input file


class BatchErrors(BaseModel):
    object: Literal["list"] = "list"
    data: list[BatchError] = Field(default_factory=list)


class BatchObject(BaseModel):
    id: str
    object: Literal["batch"] = "batch"
    endpoint: str
    input_file_id: str
    completion_window: str
    status: BatchStatus
    created_at: int
    expires_at: int
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: BatchErrors | None = None
    in_progress_at: int | None = None
    finalizing_at: int | None = None
    completed_at: int | None = None
    failed_at: int | None = None
    expired_at: int | None = None
    cancelling_at: int | None = None
    cancelled_at: int | None = None
    request_counts: RequestCounts = Field(default_factory=RequestCounts)
    metadata: dict[str, str] | None = None
    model: str | None = None
