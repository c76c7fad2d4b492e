"""Where `conveyor submit` and `conveyor batch` add a job on one Redis: as the gateway chooses it.

A job that names a model goes to the stream that model's live workers read (the worker registry,
worker/fleet/registry.py, and worker/gateway/fleet_view.py's ServedModel.stream_for: their lanes or
their one stream); a job that names none goes to `--stream` (default `<prefix>:requests`, or its lane by
the lane layout). When no live worker would read it, the client says so in one line and queues nothing
(exit 1), as the gateway answers 503 `no_live_worker`; `--wait` queues it anyway, on the stream the
model's workers will read (`<prefix>:requests:<model>`), to wait for them.
"""

from __future__ import annotations

import json

import redis

from worker.client import request_stream
from worker.fleet.registry import live, read
from worker.gateway.fleet_view import ServedModel
from worker.intake.lane_layout import read_layout, register_tenant
from worker.keys import JOB_FIELD, Keys, requests_stream_name


class NoLiveWorker(RuntimeError):
    """No live worker reads where the job would go; the message is one line for the user."""


class ModelRouter:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys
        records = [r for r in live(read(client, keys)) if not r.draining]
        by_model: dict[str, list] = {}
        for r in records:
            by_model.setdefault(r.model, []).append(r)
        self.models = {name: ServedModel(name, ws) for name, ws in sorted(by_model.items())}
        self._read_streams = {s for r in records for s in r.streams}

    def check(self, model: str | None) -> None:
        """NoLiveWorker unless a live worker takes jobs for `model` (None: jobs for `--stream`)."""
        served = ", ".join(self.models) or "none"
        if model is not None and model not in self.models:
            raise NoLiveWorker(
                f"no live worker serves model {model!r} (live workers serve: {served}); "
                f"--wait queues anyway on {requests_stream_name(self.keys.prefix, model)}"
            )
        if model is None and not self._default_streams() & self._read_streams:
            hint = f"name one with --model, or --wait to queue anyway on {self.keys.requests}"
            raise NoLiveWorker(
                f"no live worker reads {self.keys.requests} (live workers serve: {served}); {hint}"
            )

    def stream(self, job: dict, model: str | None) -> str:
        """The stream `job` is added to (its affinity key, when it has one, already set); a tenant with a
        lane new to the workers is registered on the way (lane_layout.register_tenant)."""
        if model is None:
            return request_stream(self.client, job, self.keys)
        served = self.models.get(model)
        if served is None:  # --wait: where its workers will read (and its lane, once they wrote a layout)
            waiting = Keys(
                prefix=self.keys.prefix, requests_stream=requests_stream_name(self.keys.prefix, model)
            )
            return request_stream(self.client, job, waiting)
        layout_keys = served.layout_keys(self.keys.prefix)
        layout = read_layout(self.client, layout_keys) if layout_keys is not None else None
        register_tenant(self.client, layout, job)
        return served.stream_for(job, self.keys.prefix, layout)

    def add(self, job: dict, model: str | None) -> str:
        stream = self.stream(job, model)
        self.client.xadd(stream, {JOB_FIELD: json.dumps(job)})
        return stream

    def _default_streams(self) -> set[str]:
        layout = read_layout(self.client, self.keys)
        return {self.keys.requests, *(layout.streams if layout is not None else ())}
