"""Every Redis key, stream and channel name the worker and its clients use, in one place (like arq's constants)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.config import knob


@dataclass(frozen=True)
class Keys:
    """Names under one prefix. The request and dead-letter streams can be renamed on their own."""

    # Each field is a command-line option (worker/cli/options.py).
    prefix: str = knob("conveyor", "key prefix")
    requests_stream: str = knob("", "requests stream (default <prefix>:requests)", cli="stream")
    dead_stream: str = knob("", "dead-letter stream (default <prefix>:dead)")
    served_model: str = knob(
        "",
        "the model name clients ask for; given, its jobs have a stream of their own, "
        "<prefix>:requests:<name> (default: the checkpoint folder's name, on <prefix>:requests)",
        cli="served-model-name",
    )

    def __post_init__(self) -> None:
        if self.served_model and not SERVED_MODEL.match(self.served_model):
            raise ValueError(f"served model name {self.served_model!r} does not match {SERVED_MODEL.pattern}")

    @property
    def requests(self) -> str:
        return self.requests_stream or requests_stream_name(self.prefix, self.served_model)

    @property
    def dead(self) -> str:
        return self.dead_stream or f"{self.prefix}:dead"

    def lane(self, name: str) -> str:
        """A lane's request stream beside the requests stream (intake/lanes.py, intake/lane_layout.py)."""
        return f"{self.requests}:{name}"

    @property
    def lane_layout(self) -> str:
        """The lane layout (JSON, intake/lane_layout.py): which stream a job goes to; absent: the requests
        stream. Written by workers with priority or tenant lanes, read by clients."""
        return f"{self.requests}:lanes"

    @property
    def cancel_channel(self) -> str:
        return f"{self.prefix}:cancel"

    @property
    def attempts(self) -> str:
        """Hash job id -> attempts started (counted before running, so a crash counts), and
        `alone_field(id)` -> 1 once an attempt ran alone (worker/run/isolation.py)."""
        return f"{self.prefix}:attempts"

    def out(self, job_id: str) -> str:
        """The per-request output stream; the pub/sub channel has the same name."""
        return f"{self.prefix}:out:{job_id}"

    def cancel(self, job_id: str) -> str:
        return f"{self.prefix}:cancel:{job_id}"

    @property
    def workers(self) -> str:
        """Sorted set of worker consumer names by last heartbeat: the registry's index (worker/fleet/registry.py)."""
        return f"{self.prefix}:workers"

    def worker(self, consumer: str) -> str:
        """A live worker's registry record (JSON), expiring one TTL after its last heartbeat."""
        return f"{self.prefix}:worker:{consumer}"

    @property
    def usage(self) -> str:
        """Hash of per-tenant, per-model usage counters (worker/fleet/accounting.py), added to by the
        terminal script."""
        return f"{self.prefix}:usage"

    @property
    def batches(self) -> str:
        """Hash of batch id -> progress JSON (worker/fleet/snapshot.py BatchView), kept by batch drivers."""
        return f"{self.prefix}:batches"

    def owner(self, job_id: str) -> str:
        """Consumer name running the job; expires with the lease, so a duplicate enqueue is not run twice."""
        return f"{self.prefix}:owner:{job_id}"

    # Files and batches of the HTTP API (worker/batch/file_store.py, worker/batch/batch_store.py). A batch's
    # keys share the hash tag {<batch id>}, so the scripts that write several of them run on one cluster node.
    def file(self, file_id: str) -> str:
        """Hash: `meta` (the File object's JSON, with its tenant) and `content` (the bytes)."""
        return f"{self.prefix}:file:{file_id}"

    def tenant_files(self, tenant: str) -> str:
        """Sorted set of a tenant's file ids by creation time (seconds)."""
        return f"{self.prefix}:tenant:{tenant}:files"

    def batch(self, batch_id: str, part: str = "") -> str:
        """Hash of the Batch object's fields; with `part`: `lease` (string, the driving replica's token,
        PX), `answered` (set of custom_ids written), `output` / `errors` (lists of output lines)."""
        return f"{self.prefix}:batch:{{{batch_id}}}" + (f":{part}" if part else "")

    def tenant_batches(self, tenant: str) -> str:
        """Sorted set of a tenant's batch ids by creation time (seconds)."""
        return f"{self.prefix}:tenant:{tenant}:batches"

    @property
    def batches_open(self) -> str:
        """Set of the ids of batches not yet in a final state: what the gateways' drivers take leases on."""
        return f"{self.prefix}:batches:open"


# A served model name: hub ids ("org/name"), tags ("name:8b"); no spaces or braces (cluster hash tags).
SERVED_MODEL = re.compile(r"^[A-Za-z0-9._:/-]{1,128}$")


def requests_stream_name(prefix: str, served_model: str = "") -> str:
    """The one rule for where a model's jobs go: a deployment that names its model (--served-model-name)
    has a stream per model, so workers of two models never read each other's jobs; one that names none
    keeps protocol version 1's single stream."""
    return f"{prefix}:requests:{served_model}" if served_model else f"{prefix}:requests"


# Field names inside stream entries.
JOB_FIELD = b"job"
EVENT_FIELD = b"event"


def group_name(model: str) -> str:
    """One consumer group per model: a local folder's name, a local file's name less its suffix (a .gguf
    file), or a hub id with '/' written as '--'."""
    import os

    path = model.rstrip("/")
    if os.path.isfile(path):
        return os.path.splitext(os.path.basename(path))[0]
    return os.path.basename(path) if os.path.isdir(path) else path.replace("/", "--")


def alone_field(job_id: str) -> str:
    """The attempts hash's field saying an attempt of `job_id` ran alone ("/" is in no job id)."""
    return f"{job_id}/alone"
