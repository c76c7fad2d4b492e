"""Where the gateway's batch lines go: the request stream of the model each line's body names, chosen as
`/v1/chat/completions` chooses it (worker/gateway/fleet_view.py's ServedModel.stream_for over the worker
registry), read synchronously for the batch drivers' threads at most every CACHE_S.

A model nobody serves now but whose stream exists (its workers are restarting) still gets its jobs there,
to wait for them; a model with neither is answered with a `model_not_found` error line, as a chat request
is answered 404.
"""

from __future__ import annotations

import time

import redis

from worker.affinity_key import with_affinity
from worker.batch.input_line import BatchRequest
from worker.client import enqueue
from worker.cluster.shard_keys import ShardedKeys, keys_of_shard_stream
from worker.fleet.registry import live, read
from worker.gateway.fleet_view import CACHE_S, ServedModel
from worker.intake.lane_layout import read_layout, register_tenant
from worker.job_queue import JobQueue
from worker.keys import Keys, requests_stream_name
from worker.openai.request import RequestError


class ModelRoutes:
    def __init__(self, client: redis.Redis, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._read_at = -1e9
        self._models: dict[str, ServedModel] = {}

    def submit(self, queue: JobQueue, request: BatchRequest) -> int:
        """A JobTemplate.submit: XADD to the line's model's stream. Returns the shard whose output stream
        holds the job's events: 0 on one Redis; in a cluster the shard the stream belongs to (its output
        stream shares the stream's hash tag, as job_io.keys_of_stream names it)."""
        job = with_affinity(request.job.wire())
        stream = self.stream(request.model, job)
        if queue.shards == 1 and keys_of_shard_stream(self.keys.prefix, stream) is not None:
            raise RequestError(
                "unsupported_layout",
                "the Batch API reads shards only in cluster mode (conveyor serve --cluster); this model's "
                "workers read protocol version 2's shards on one Redis (docs/http.md)",
            )
        enqueue(self.client, job, Keys(prefix=self.keys.prefix, requests_stream=stream), affinity=False)
        return 0 if queue.shards == 1 else ShardedKeys(self.keys.prefix, queue.shards).shard_of(stream)

    def stream(self, model: str, job: dict) -> str:
        served = self._served().get(model)
        if served is not None:
            layout_keys = served.layout_keys(self.keys.prefix)
            layout = read_layout(self.client, layout_keys) if layout_keys is not None else None
            register_tenant(self.client, layout, job)
            return served.stream_for(job, self.keys.prefix, layout)
        waiting = requests_stream_name(self.keys.prefix, model)
        if self.client.exists(waiting):
            return waiting
        raise RequestError("model_not_found", f"The model `{model}` does not exist.")

    def _served(self) -> dict[str, ServedModel]:
        if time.monotonic() - self._read_at > CACHE_S:
            by_model: dict[str, list] = {}
            for record in live(read(self.client, self.keys)):
                if not record.draining:
                    by_model.setdefault(record.model, []).append(record)
            self._models = {name: ServedModel(name, ws) for name, ws in by_model.items()}
            self._read_at = time.monotonic()
        return self._models
