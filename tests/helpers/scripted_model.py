"""A model the test itself serves: a live registry record (no worker process) makes a gateway route its
jobs to a stream nobody else reads, and the test writes each job's events as a worker would, or an entry no
worker writes (what anyone with the workers' Redis rights can write)."""

from __future__ import annotations

import json

import redis

from tests.helpers.waiting import wait_until
from worker.fleet.heartbeat import Heartbeat
from worker.keys import EVENT_FIELD, JOB_FIELD, Keys, requests_stream_name


def token(k: int, text: str = "a") -> dict:
    return {"type": "token", "index": k, "token_ids": [k], "text": text}


def done(text: str, reason: str = "length", why: str | None = None) -> dict:
    timing = {"queue_ms": 0.0, "ttft_ms": 1.0, "total_ms": 2.0}
    usage = {"prompt_tokens": 1, "completion_tokens": len(text)}
    event = {"type": "done", "finish_reason": reason, "text": text, "usage": usage, "timing": timing}
    return {**event, "reason": why} if why else event


class ScriptedModel:
    def __init__(self, url: str, name: str = "scripted", keys: Keys | None = None) -> None:
        self.r, self.keys, self.name = redis.Redis.from_url(url), keys or Keys(), name
        self.stream = requests_stream_name(self.keys.prefix, name)
        Heartbeat(
            self.r, self.keys, consumer=f"script-{name}", model=name, group=name, streams=[self.stream],
            max_model_len=512, capacity=64, interval_s=600,
        ).beat()  # fmt: skip
        try:
            self.r.xgroup_create(self.stream, name, id="$", mkstream=True)
        except redis.ResponseError:  # made by an earlier test of the module
            pass

    def jobs(self) -> dict[str, dict]:
        """Every job added to the model's stream so far, by id (the last one of an id sent twice)."""
        found = (json.loads(fields[JOB_FIELD]) for _, fields in self.r.xrange(self.stream))
        return {job["id"]: job for job in found}

    def wait_jobs(self, *job_ids: str, timeout_s: float = 30) -> dict[str, dict]:
        jobs = wait_until(
            lambda: (found := self.jobs()) and all(j in found for j in job_ids) and found,
            timeout_s,
            f"jobs {job_ids} on {self.stream}",
            0.02,
        )
        return {j: jobs[j] for j in job_ids}

    def emit(self, job_id: str, *events: dict) -> None:
        for event in events:
            self.emit_raw(job_id, json.dumps(event).encode())

    def emit_raw(self, job_id: str, raw: bytes) -> None:
        self.r.xadd(self.keys.out(job_id), {EVENT_FIELD: raw})

    def close(self) -> None:
        self.r.close()
