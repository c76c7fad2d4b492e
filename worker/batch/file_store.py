"""Files of the HTTP API (`/v1/files`) kept in Redis, so every gateway replica reads the same files.

    <prefix>:file:<id>              hash: meta (the File object's JSON plus its tenant), content (bytes)
    <prefix>:tenant:<tenant>:files  sorted set: the tenant's file ids by creation time (epoch seconds, fractional)

A file belongs to the tenant that created it: another tenant's id reads as unknown. Uploads are capped at
`max_bytes`; output files written by the batch driver (purpose batch_output) are not.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any, Literal

import redis

from worker.batch.api_objects import FileObject, FilePurpose
from worker.keys import Keys

DEFAULT_MAX_FILE_BYTES = 64 * 1024 * 1024


class FileTooLarge(ValueError):
    pass


def new_file_id() -> str:
    return f"file-{uuid.uuid4().hex}"


class FileStore:
    def __init__(self, client: redis.Redis, keys: Keys, max_bytes: int = DEFAULT_MAX_FILE_BYTES) -> None:
        self.client, self.keys, self.max_bytes = client, keys, max_bytes

    def create(
        self,
        tenant: str,
        filename: str,
        purpose: FilePurpose,
        content: bytes,
        file_id: str | None = None,
    ) -> FileObject:
        """Store a file. With `file_id` (the driver's output files) an existing file of that id is replaced,
        so writing it again after a crash is harmless."""
        if purpose == "batch" and len(content) > self.max_bytes:
            raise FileTooLarge(f"file is {len(content)} bytes, over the limit of {self.max_bytes}")
        obj = FileObject(
            id=file_id or new_file_id(),
            bytes=len(content),
            created_at=int(time.time()),
            filename=filename,
            purpose=purpose,
        )
        meta = json.dumps({**obj.model_dump(), "tenant": tenant})
        # Two keys, two slots in a cluster: the record first, then the index (a lost index entry only hides
        # the file from listings; list() skips index entries without a record).
        self.client.hset(self.keys.file(obj.id), mapping={"meta": meta, "content": content})
        self.client.zadd(self.keys.tenant_files(tenant), {obj.id: time.time()})
        return obj

    def get(self, tenant: str, file_id: str) -> FileObject | None:
        meta = self._meta(tenant, file_id)
        return None if meta is None else _object(meta)

    def content(self, tenant: str, file_id: str) -> bytes | None:
        raw: Any = self.client.hmget(self.keys.file(file_id), ["meta", "content"])
        if raw[0] is None or json.loads(raw[0]).get("tenant") != tenant:
            return None
        return raw[1] or b""

    def page(
        self,
        tenant: str,
        purpose: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
        after: str | None = None,
    ) -> list[FileObject]:
        ids: Any = self.client.zrange(self.keys.tenant_files(tenant), 0, -1, desc=order == "desc")
        ids = [i.decode() if isinstance(i, bytes) else i for i in ids]
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        pipe = self.client.pipeline(transaction=False)
        for file_id in ids:
            pipe.hget(self.keys.file(file_id), "meta")
        found = []
        for raw in pipe.execute():
            if raw is None:
                continue
            obj = _object(json.loads(raw))
            if purpose is None or obj.purpose == purpose:
                found.append(obj)
            if len(found) == limit:
                break
        return found

    def delete(self, tenant: str, file_id: str) -> bool:
        if self._meta(tenant, file_id) is None:
            return False
        self.client.delete(self.keys.file(file_id))
        self.client.zrem(self.keys.tenant_files(tenant), file_id)
        return True

    def _meta(self, tenant: str, file_id: str) -> dict | None:
        raw: Any = self.client.hget(self.keys.file(file_id), "meta")
        if raw is None:
            return None
        meta = json.loads(raw)
        return meta if meta.get("tenant") == tenant else None


def _object(meta: dict) -> FileObject:
    return FileObject.model_validate({k: v for k, v in meta.items() if k != "tenant"})
