"""Batches of the HTTP API (`/v1/batches`) in Redis: OpenAI's Batch objects, readable by every replica.

    <prefix>:batch:{<id>}              hash: meta (the fixed fields' JSON, with the tenant), status,
                                       <status>_at timestamps, total / completed / failed,
                                       output_file_id, error_file_id, errors (JSON)
    <prefix>:tenant:<tenant>:batches   sorted set: the tenant's batch ids by creation time (epoch seconds, fractional)
    <prefix>:batches:open              set: ids of batches not in a final state (what drivers lease)

Status changes are Lua scripts that check the current status, so a cancel and the driver's own moves never
overwrite each other; the driver's also check that it still holds the batch's lease (driver.py).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import redis

from worker.batch.api_objects import (
    CANCELLABLE_STATUSES,
    BatchErrors,
    BatchObject,
    RequestCounts,
)
from worker.keys import Keys

# completion_window: OpenAI accepts only "24h"; any "<n>s|m|h" is accepted here (a short one for tests).
_WINDOW = re.compile(r"^([1-9][0-9]{0,6})([smh])$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600}

# KEYS: batch hash, lease key (or "" when the caller holds none). ARGV: lease token ("" for none),
# allowed current statuses (comma-separated), then field/value pairs to set. -1: lease lost; 0: the status
# was not one of the allowed ones (nothing set); 1: set.
_MOVE = """
if ARGV[1] ~= '' and redis.call('GET', KEYS[2]) ~= ARGV[1] then return -1 end
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return 0 end
local allowed = false
for s in string.gmatch(ARGV[2], '[^,]+') do if s == status then allowed = true end end
if not allowed then return 0 end
redis.call('HSET', KEYS[1], unpack(ARGV, 3))
return 1
"""


class BadWindow(ValueError):
    pass


def window_seconds(completion_window: str) -> int:
    m = _WINDOW.match(completion_window)
    if m is None:
        raise BadWindow(
            f"completion_window must be like '24h' (a number and s, m or h), got {completion_window!r}"
        )
    return int(m.group(1)) * _UNIT_S[m.group(2)]


class LeaseLost(RuntimeError):
    """Another replica took the batch over: stop driving it and touch nothing more."""


class BatchStore:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._move = client.register_script(_MOVE)

    def create(
        self,
        tenant: str,
        input_file_id: str,
        endpoint: str,
        completion_window: str,
        metadata: dict[str, str] | None = None,
        tag_jobs: bool = True,
    ) -> BatchObject:
        """`tag_jobs`: the batch's jobs carry the tenant (false for a gateway that asks for no API key)."""
        now = int(time.time())
        batch = BatchObject(
            id=f"batch_{uuid.uuid4().hex}",
            endpoint=endpoint,
            input_file_id=input_file_id,
            completion_window=completion_window,
            status="validating",
            created_at=now,
            expires_at=now + window_seconds(completion_window),
            metadata=metadata,
        )
        fixed = {
            k: v
            for k, v in batch.model_dump().items()
            if k in ("id", "endpoint", "input_file_id", "completion_window", "created_at", "expires_at")
        }
        meta = json.dumps({**fixed, "metadata": metadata, "tenant": tenant, "tag_jobs": tag_jobs})
        self.client.hset(self.keys.batch(batch.id), mapping={"meta": meta, "status": "validating"})
        self.client.zadd(self.keys.tenant_batches(tenant), {batch.id: time.time()})
        self.client.sadd(self.keys.batches_open, batch.id)
        return batch

    def get(self, tenant: str | None, batch_id: str) -> BatchObject | None:
        """The batch if `tenant` owns it (None: whoever owns it, for the driver)."""
        fields: Any = self.client.hgetall(self.keys.batch(batch_id))
        return _object(fields, tenant)

    def owner_of(self, batch_id: str) -> tuple[str, bool] | None:
        """(tenant, whether its jobs carry the tenant), or None for an unknown batch."""
        raw: Any = self.client.hget(self.keys.batch(batch_id), "meta")
        if raw is None:
            return None
        meta = json.loads(raw)
        return meta["tenant"], meta.get("tag_jobs", True)

    def page(self, tenant: str, limit: int = 20, after: str | None = None) -> list[BatchObject]:
        """Newest first, as OpenAI lists them; `after` is the last id of the previous page."""
        ids: Any = self.client.zrange(self.keys.tenant_batches(tenant), 0, -1, desc=True)
        ids = [i.decode() if isinstance(i, bytes) else i for i in ids]
        if after is not None:
            ids = ids[ids.index(after) + 1 :] if after in ids else []
        found = []
        for batch_id in ids:
            batch = self.get(tenant, batch_id)
            if batch is not None:
                found.append(batch)
            if len(found) == limit:
                break
        return found

    def cancel(self, tenant: str, batch_id: str) -> BatchObject | None:
        """validating / in_progress -> cancelling; any other status is left as it is (the caller tells)."""
        if self.get(tenant, batch_id) is None:
            return None
        self.move(batch_id, CANCELLABLE_STATUSES, {"status": "cancelling", "cancelling_at": int(time.time())})
        return self.get(tenant, batch_id)

    def move(
        self,
        batch_id: str,
        allowed: frozenset[str] | set[str],
        fields: dict,
        lease: tuple[str, str] | None = None,
    ) -> bool:
        """Set `fields` if the status is one of `allowed` (and, with `lease` = (key, token), the lease is
        still held: else LeaseLost). True when set."""
        lease_key, token = lease or ("", "")
        keys = [self.keys.batch(batch_id), lease_key or self.keys.batch(batch_id, "lease")]
        args: list[Any] = [token, ",".join(sorted(allowed))]
        for k, v in fields.items():
            args += [k, json.dumps(v) if isinstance(v, dict) else v]
        done = self._move(keys=keys, args=args)
        if done == -1:
            raise LeaseLost(batch_id)
        return done == 1

    def forget_open(self, batch_id: str) -> None:
        self.client.srem(self.keys.batches_open, batch_id)

    def open_ids(self) -> list[str]:
        ids: Any = self.client.smembers(self.keys.batches_open)
        return sorted(i.decode() if isinstance(i, bytes) else i for i in ids)


def _object(fields: dict, tenant: str | None) -> BatchObject | None:
    f = {
        (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
        for k, v in fields.items()
    }
    if "meta" not in f:
        return None
    meta = json.loads(f["meta"])
    if tenant is not None and meta.pop("tenant") != tenant:
        return None
    meta.pop("tenant", None)
    meta.pop("tag_jobs", None)
    stamps = {
        k: int(f[k])
        for k in (
            "in_progress_at",
            "finalizing_at",
            "completed_at",
            "failed_at",
            "expired_at",
            "cancelling_at",
            "cancelled_at",
        )
        if k in f
    }
    counts = RequestCounts(**{k: int(f[k]) for k in ("total", "completed", "failed") if k in f})
    errors = BatchErrors.model_validate_json(f["errors"]) if "errors" in f else None
    return BatchObject(
        **meta,
        **stamps,
        status=f["status"],
        request_counts=counts,
        errors=errors,
        output_file_id=f.get("output_file_id"),
        error_file_id=f.get("error_file_id"),
    )
