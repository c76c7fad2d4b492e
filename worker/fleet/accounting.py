"""Per-tenant accounting: prompt tokens, completion tokens and engine-seconds, per tenant and model.

Engine-seconds are each engine step's wall time split over the jobs in it in proportion to the tokens the
step computed for each (a prefill chunk weighs its length, a decode step one token per sample), so the
jobs' engine-seconds add up to the time the engine spent stepping them.

The counters live in one Redis hash per key prefix (`Keys.usage`: `<prefix>:usage`, and in the sharded
layout one per shard, `<prefix>:{s<k>}:usage`, in the shard's slot), written by the publisher's terminal
script (worker/publish/publisher.py) together with the job's terminal event: a job is counted once, by
the worker whose terminal event was written, in the round that step already sends. Field names:

    <counter>:<tenant>:<model>     counter: one of COUNTERS (integers); tenant: the job's `tenant` or "default"
                                   (a tenant holds no ':'); model: the worker's group (may hold ':')
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from pydantic import BaseModel

DEFAULT_TENANT = "default"  # the tenant of a job that names none (the gateway's default tenant too)
# Engine time is counted in microseconds: HINCRBY only (the worker's ACL list has no HINCRBYFLOAT).
JOBS, PROMPT, COMPLETION, ENGINE_US = "jobs", "prompt_tokens", "completion_tokens", "engine_us"
COUNTERS = (JOBS, PROMPT, COMPLETION, ENGINE_US)


class TenantUsage(BaseModel):
    """One tenant's use of one model, summed over the fleet."""

    tenant: str
    model: str
    jobs: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    engine_seconds: float = 0.0


def split_step(wall_s: float, tokens: Mapping[str, int]) -> dict[str, float]:
    """A step's wall time shared out by tokens computed: {request id: seconds}. Nothing computed, nothing
    shared (a step that only finished aborted requests)."""
    total = sum(tokens.values())
    if total <= 0:
        return {}
    return {rid: wall_s * n / total for rid, n in tokens.items() if n > 0}


def field_suffix(tenant: str | None, model: str) -> str:
    """`<tenant>:<model>`: the part of a job's counter fields after the counter's name."""
    return f"{tenant or DEFAULT_TENANT}:{model}"


def parse(hashes: Iterable[Mapping[bytes | str, bytes | str]]) -> list[TenantUsage]:
    """The usage hashes (HGETALL replies, one per prefix or shard) summed per (tenant, model)."""
    found: dict[tuple[str, str], TenantUsage] = {}
    for fields in hashes:
        for raw_name, raw_value in fields.items():
            name = raw_name.decode() if isinstance(raw_name, bytes) else raw_name
            parts = name.split(":", 2)
            if len(parts) != 3 or parts[0] not in COUNTERS:
                continue  # a field some newer worker writes: not ours to read
            counter, tenant, model = parts
            usage = found.setdefault((tenant, model), TenantUsage(tenant=tenant, model=model))
            value = int(raw_value)
            if counter == ENGINE_US:
                usage.engine_seconds += value / 1e6
            else:
                setattr(usage, counter, getattr(usage, counter) + value)
    return sorted(found.values(), key=lambda u: (u.model, u.tenant))
