"""The gateway's settings: one frozen object, validated once when `conveyor serve` starts (or a test builds it)."""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field, field_validator

from worker.batch.api_config import BatchApiConfig
from worker.config import CLUSTER_SHARDS
from worker.keys import Keys
from worker.protocol import TENANT_PATTERN
from worker.redis_settings import RedisSettings

DEFAULT_TENANT = "default"  # the tenant of a key given without one (`--api-key KEY`)


_REDIS = RedisSettings()


class GatewaySettings(BaseModel):
    """Each field but the Redis connection's (RedisSettings' options), api_keys (the repeatable --api-key),
    batches (BatchApiConfig's options), retry_after_s and read_block_ms is a `conveyor serve` option
    (worker/cli/options.py): its description is the help, its constraints the option's range, and
    json_schema_extra's "cli" the option's name where it is not the field's."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    redis_url: str = _REDIS.redis_url
    redis_socket_timeout: float = Field(_REDIS.redis_socket_timeout, gt=0)
    # TLS (rediss://), passed to redis-py as worker.connection.TlsOptions does
    redis_ca_certs: str | None = _REDIS.redis_ca_certs
    redis_certfile: str | None = _REDIS.redis_certfile
    redis_keyfile: str | None = _REDIS.redis_keyfile
    redis_cert_reqs: str | None = _REDIS.redis_cert_reqs
    prefix: str = Field(Keys().prefix, description="key prefix (the workers' --prefix)")
    cluster: bool = Field(False, description="Redis Cluster: submit to a shard (protocol version 2's keys)")
    shards: int = Field(CLUSTER_SHARDS, ge=1, description="cluster mode: the workers' --shards")
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0: every interface)")
    port: int = Field(8000, ge=0, lt=65536)
    max_body_bytes: int = Field(1 << 20, ge=1024, description="larger bodies get 413")
    # jobs waiting in a model's stream before 429 (0: no limit)
    max_queued: int = Field(0, ge=0, description="queued jobs per model before 429 (0: off)")
    # 504 after this; also the job's deadline
    request_timeout_s: float = Field(
        600.0, gt=0, description="seconds before 504", json_schema_extra={"cli": "request-timeout"}
    )
    metrics_port: int = Field(
        0, ge=0, lt=65536, description="Prometheus port of its own (0: off; /metrics is served too)"
    )
    # API key -> tenant. Empty: no key is asked for, and jobs carry no tenant.
    api_keys: dict[str, str] = Field(default_factory=dict)
    retry_after_s: int = Field(1, ge=1)  # the Retry-After of a 429
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
