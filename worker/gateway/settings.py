"""The gateway's settings: one frozen object, validated once when `conveyor serve` starts (or a test builds it)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from worker.batch.api_config import BatchApiConfig
from worker.protocol import TENANT_PATTERN

DEFAULT_TENANT = "default"  # the tenant of a key given without one (`--api-key KEY`)


class GatewaySettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    redis_url: str = "redis://localhost:6379/0"
    redis_socket_timeout: float = Field(30.0, gt=0)
    # TLS (rediss://), passed to redis-py as worker.connection.TlsOptions does
    redis_ca_certs: str | None = None
    redis_certfile: str | None = None
    redis_keyfile: str | None = None
    redis_cert_reqs: str | None = None
    cluster: bool = False
    shards: int = Field(8, ge=1)
    prefix: str = "conveyor"
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, lt=65536)
    metrics_port: int = Field(0, ge=0, lt=65536)  # 0: no Prometheus listener of its own (/metrics still is)
    # API key -> tenant. Empty: no key is asked for, and jobs carry no tenant.
    api_keys: dict[str, str] = Field(default_factory=dict)
    max_body_bytes: int = Field(1 << 20, ge=1024)  # 413 above this
    max_queued: int = Field(0, ge=0)  # jobs waiting in a model's stream before 429 (0: no limit)
    retry_after_s: int = Field(1, ge=1)  # the Retry-After of a 429
    request_timeout_s: float = Field(600.0, gt=0)  # 504 after this; also the job's deadline
    read_block_ms: int = Field(2000, ge=1)  # longest XREAD BLOCK on an output stream
    batches: BatchApiConfig = Field(default_factory=BatchApiConfig)  # /v1/files and /v1/batches

    @field_validator("api_keys")
    @classmethod
    def _tenants_valid(cls, keys: dict[str, str]) -> dict[str, str]:
        import re

        for key, tenant in keys.items():
            if not key:
                raise ValueError("an API key may not be empty")
            if not re.match(TENANT_PATTERN, tenant):
                raise ValueError(f"tenant {tenant!r} does not match {TENANT_PATTERN}")
        return keys

    @property
    def block_ms(self) -> int:
        """XREAD must return before the socket timeout, or a quiet stream reads as a lost connection."""
        return max(1, min(self.read_block_ms, int(self.redis_socket_timeout * 1000 / 2)))


def parse_api_keys(values: Iterable[str]) -> dict[str, str]:
    """`KEY` (tenant "default") or `TENANT=KEY`, each value possibly a comma-separated list (as in
    CONVEYOR_API_KEYS). A key that holds "=" must be written with its tenant. Raises ValueError."""
    keys: dict[str, str] = {}
    for value in values:
        for item in filter(None, (part.strip() for part in value.split(","))):
            tenant, sep, key = item.partition("=")
            if not sep:
                tenant, key = DEFAULT_TENANT, item
            if not key:
                raise ValueError(f"API key for tenant {tenant!r} is empty")
            if keys.get(key, tenant) != tenant:
                raise ValueError("one API key is given for two tenants")
            keys[key] = tenant
    return keys
