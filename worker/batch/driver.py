"""Drive one batch of the HTTP API to a final status, under its lease (batch_lease.py).

    validating ─▶ in_progress ─▶ (runner.py over the stored input file, answers in Redis: redis_sink.py)
               │                  ─▶ finalizing ─▶ output / error files ─▶ completed
               │                  ─▶ (cancel) cancelling ─▶ cancelled   (past expires_at) ─▶ expired
               └▶ failed (the file does not pass input_checks.py, or is gone)

Every step is safe to run again: a replica that takes the lease over after a crash calls drive_batch on the
same batch and continues from the status it finds. Jobs are named by batch id and custom_id, so lines that
were in flight are re-enqueued under the same ids (the workers deduplicate them) and their events read from
the start of their output streams; lines already answered are skipped.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from worker.batch.api_config import BatchApiConfig
from worker.batch.api_objects import FINAL_STATUSES, BatchError, BatchErrors, BatchObject
from worker.batch.batch_lease import BatchLease
from worker.batch.batch_store import BatchStore
from worker.batch.file_store import FileStore
from worker.batch.input_checks import check_input, input_lines
from worker.batch.input_line import BatchRequest
from worker.batch.redis_sink import CANCELLED, EXPIRED, RedisSink
from worker.batch.runner import BatchRunner, JobTemplate
from worker.batch.sink import Stop
from worker.job_queue import JobQueue
from worker.keys import Keys


def batch_job_id(batch_id: str, custom_id: str) -> str:
    """One job id per (batch, custom_id): the same after a takeover, so the workers deduplicate it."""
    return f"{batch_id}:{hashlib.sha256(custom_id.encode()).hexdigest()[:24]}"


def output_file_id(batch_id: str, part: str) -> str:
    return f"file-{batch_id.removeprefix('batch_')}-{part}"


class BatchDriver:
    def __init__(
        self,
        client: redis.Redis,
        queue: JobQueue,
        keys: Keys,
        files: FileStore,
        cfg: BatchApiConfig,
        submit: Callable[[JobQueue, BatchRequest], int] | None = None,
    ) -> None:
        """`submit`: how a line's job is queued (JobTemplate.submit; None: the queue's own stream)."""
        self.client, self.queue, self.keys, self.files, self.cfg = client, queue, keys, files, cfg
        self.submit = submit
        self.store = BatchStore(client, keys)

    def drive(self, batch_id: str, lease: BatchLease, leaving: threading.Event | None = None) -> None:
        """Raises LeaseLost (from batch_store) when another replica took the batch over, Handover when
        `leaving` is set (this replica stops) while lines run."""
        batch, owner = self.store.get(None, batch_id), self.store.owner_of(batch_id)
        if batch is None or owner is None:
            self.store.forget_open(batch_id)
            return
        fence = (lease.key, lease.token)
        if batch.status not in FINAL_STATUSES:
            self._run(batch, owner, lease, fence, leaving)
        self._clean_up(batch_id, lease)

    def _run(
        self,
        batch: BatchObject,
        owner: tuple[str, bool],
        lease: BatchLease,
        fence: tuple[str, str],
        leaving: threading.Event | None,
    ) -> None:
        tenant, tag_jobs = owner
        content = self.files.content(tenant, batch.input_file_id)
        if batch.in_progress_at is None and not self._start(batch, content, fence):
            return
        if content is None:
            self._finish(batch, tenant, "failed", fence, errors=[_gone(batch.input_file_id)])
            return
        sink = RedisSink(
            self.client,
            self.keys,
            batch.id,
            lease,
            batch.expires_at,
            leaving=leaving,
            board_key=self.keys.batches,
        )
        runner = BatchRunner(self.queue, max_in_flight=self.cfg.max_in_flight, drain_s=self.cfg.drain_s)
        template = JobTemplate(
            job_id=lambda custom_id, line: batch_job_id(batch.id, custom_id),
            fields={"deadline_ms": batch.expires_at * 1000, **({"tenant": tenant} if tag_jobs else {})},
            submit=self.submit,
        )
        try:
            runner.drive(lambda: input_lines(content), sink, template)
        finally:
            sink.close()
        self._finish(batch, tenant, self._outcome(batch, sink.stop(), fence), fence)

    def _start(self, batch: BatchObject, content: bytes | None, fence: tuple[str, str]) -> bool:
        """validating -> in_progress (True), or -> failed / cancelled (False)."""
        now = int(time.time())
        cancelled = {"status": "cancelled", "cancelled_at": now}
        if batch.status == "cancelling":  # cancelled before it started: nothing ran, nothing to write
            self.store.move(batch.id, {"cancelling"}, cancelled, fence)
            return False
        if content is None:
            errors = [_gone(batch.input_file_id)]
        else:
            errors = check_input(content, batch.endpoint, self.cfg.max_lines)
        if errors:
            failed = {"status": "failed", "failed_at": now, "errors": BatchErrors(data=errors).model_dump()}
            self.store.move(batch.id, {"validating"}, failed, fence)
            return False
        if self.store.move(batch.id, {"validating"}, {"status": "in_progress", "in_progress_at": now}, fence):
            return True
        self.store.move(batch.id, {"cancelling"}, cancelled, fence)  # cancelled meanwhile
        return False

    def _outcome(self, batch: BatchObject, stopped: Stop | None, fence: tuple[str, str]) -> str:
        """The final status once every line is answered."""
        if stopped is CANCELLED:
            return "cancelled"
        if stopped is EXPIRED or (time.time() >= batch.expires_at and self._failed(batch.id)):
            # Past the window with lines that failed (the workers stop jobs at their deadline, so all
            # lines may be answered before the stop is seen): the window was not met.
            return "expired"
        finalizing = {"status": "finalizing", "finalizing_at": int(time.time())}
        if (
            self.store.move(batch.id, {"in_progress"}, finalizing, fence)
            or self._status(batch.id) == "finalizing"
        ):
            return "completed"
        return "cancelled"  # cancelled after its last line ended: what ran is its output

    def _finish(
        self, batch: BatchObject, tenant: str, status: str, fence: tuple[str, str], errors: list | None = None
    ) -> None:
        """Write the output and error files (fixed ids: a second writer after a takeover replaces them),
        then the final status."""
        fields: dict[str, Any] = {"status": status, f"{status}_at": int(time.time())}
        for part, field in (("output", "output_file_id"), ("errors", "error_file_id")):
            lines: Any = self.client.lrange(self.keys.batch(batch.id, part), 0, -1)
            if not lines:
                continue
            file_id = output_file_id(batch.id, part)
            name = f"{batch.id}_{part}.jsonl"
            self.files.create(tenant, name, "batch_output", b"".join(lines), file_id=file_id)
            fields[field] = file_id
        if errors:
            fields["errors"] = BatchErrors(data=errors).model_dump()
        self.store.move(batch.id, {"in_progress", "finalizing", "cancelling"}, fields, fence)

    def _clean_up(self, batch_id: str, lease: BatchLease) -> None:
        if self._status(batch_id) not in FINAL_STATUSES:
            return
        self.client.delete(*(self.keys.batch(batch_id, p) for p in ("answered", "output", "errors")))
        self.store.forget_open(batch_id)
        lease.release()

    def _failed(self, batch_id: str) -> int:
        raw: Any = self.client.hget(self.keys.batch(batch_id), "failed")
        return int(raw or 0)

    def _status(self, batch_id: str) -> str | None:
        raw: Any = self.client.hget(self.keys.batch(batch_id), "status")
        return raw.decode() if isinstance(raw, bytes) else raw


def _gone(file_id: str) -> BatchError:
    return BatchError(
        code="file_not_found", message=f"input file {file_id} no longer exists", param="input_file_id"
    )
