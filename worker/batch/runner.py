"""Stream an OpenAI Batch file through the workers with a bounded number of jobs in flight.

    input line ─▶ parse ─▶ XADD job ─▶ (≤ max_in_flight) ─▶ XREAD out:<id> … ─▶ terminal event ─▶ output line

Memory: the jobs in flight plus the set of custom_ids seen (needed to refuse duplicates and to resume);
lines are read and written one at a time. The queue is one Redis or a Redis Cluster's shards
(worker/job_queue.py): in a cluster each job goes to its shard and its events are read there. Job ids are derived from the line, so a rerun after a crash
re-enqueues the same ids: the workers deduplicate them and the runner reads the events of the run it lost.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

from worker.batch.openai_input import BatchRequest, LineError, parse_custom_id, parse_line
from worker.batch.openai_logprobs import SampleLogprobs
from worker.batch.openai_output import from_event, line_error
from worker.batch.progress import Progress
from worker.batch.resume import DUPLICATE, read_answered
from worker.client import NoAnswer
from worker.fleet.batch_board import BatchBoard
from worker.job_queue import Cursor, JobQueue, read_outputs
from worker.keys import EVENT_FIELD


@dataclass
class _InFlight:
    request: BatchRequest
    cursor: Cursor
    # Per sample, when the line asked for logprobs: gathered from the token events (the done event has none).
    logprobs: dict[int, SampleLogprobs] | None = None


@dataclass(frozen=True)
class BatchSummary:
    total: int
    skipped: int  # answered by an earlier run
    done: int
    failed: int
    completion_tokens: int


class BatchRunner:
    def __init__(
        self,
        queue: JobQueue,
        max_in_flight: int = 256,
        block_ms: int = 1000,
        progress: bool | None = None,
        idle_timeout_s: float = 0.0,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.queue = queue
        # Jobs in flight and no event for this long: raise NoAnswer (0: wait for ever).
        self.idle_timeout_s = idle_timeout_s
        self._last_event = time.monotonic()
        self.max_in_flight, self.block_ms, self.progress = max_in_flight, block_ms, progress

    def run(self, input_path: str, output_path: str, errors_path: str | None = None) -> BatchSummary:
        answered = read_answered(output_path)
        total = sum(1 for line in _lines(input_path))
        skipped = sum(1 for line in _lines(input_path) if parse_custom_id(line) in answered.custom_ids)
        bar = Progress(total, skipped, self.progress)
        # Seen by `conveyor top` and the dashboard (worker/fleet/batch_board.py).
        board = BatchBoard(
            self.queue.node(0), self.queue.keys(0).batches, os.path.basename(input_path), total
        )
        board.update(skipped, 0, force=True)
        self._board, self._skipped = board, skipped
        self._last_event = time.monotonic()
        inflight: dict[str, _InFlight] = {}
        seen: set[str] = set()
        with open(output_path, "a", encoding="utf-8") as out, _maybe_open(errors_path) as errors:
            self._out, self._errors, self._bar = out, errors, bar
            for line in _lines(input_path):
                custom_id = parse_custom_id(line)
                if custom_id is not None and custom_id in seen:
                    if answered.duplicates[custom_id] > 0:
                        answered.duplicates[custom_id] -= 1
                    else:
                        self._write(
                            line_error(custom_id, DUPLICATE, "custom_id already used by an earlier line"),
                            False,
                        )
                    continue
                if custom_id is not None:
                    seen.add(custom_id)
                    if custom_id in answered.custom_ids:
                        continue
                try:
                    request = parse_line(line)
                except LineError as exc:
                    self._write(line_error(custom_id or "", exc.code, exc.message), False)
                    continue
                while len(inflight) >= self.max_in_flight:
                    self._collect(inflight)
                shard = self.queue.submit(request.job)
                wants = request.job.get("logprobs") is not None
                inflight[self.queue.keys(shard).out(request.job["id"])] = _InFlight(
                    request, Cursor(shard), logprobs={} if wants else None
                )
            while inflight:
                self._collect(inflight)
        bar.close()
        board.close()
        return BatchSummary(total, skipped, bar.done, bar.failed, bar.tokens)

    def _collect(self, inflight: dict[str, _InFlight]) -> None:
        """Read what the in-flight jobs' streams gained (blocking up to block_ms); write finished jobs."""
        found = read_outputs(self.queue, {k: p.cursor for k, p in inflight.items()}, self.block_ms)
        now = time.monotonic()
        if found:
            self._last_event = now
        elif self.idle_timeout_s and now - self._last_event > self.idle_timeout_s:
            raise NoAnswer(
                f"no event for {len(inflight)} jobs in flight within {self.idle_timeout_s:g}s: "
                "is a worker serving this queue?"
            )
        for key, entries in found:
            pending = inflight.get(key)
            if pending is None:
                continue
            for entry_id, fields in entries:
                pending.cursor.last_id = entry_id
                event = json.loads(fields[EVENT_FIELD])
                if event.get("type") == "token" and pending.logprobs is not None:
                    pending.logprobs.setdefault(event.get("sample", 0), SampleLogprobs()).add(event)
                if event.get("type") in ("done", "error"):
                    r = pending.request
                    line, ok, tokens = from_event(
                        r.custom_id, r.url, r.model, r.job["id"], event, pending.logprobs
                    )
                    self._write(line, ok, tokens)
                    del inflight[key]
                    break

    def _write(self, line: str, ok: bool, tokens: int = 0) -> None:
        # One write of a whole line, then flush: a crash leaves whole lines (or a last partial one that
        # resume.py cuts off).
        self._out.write(line)
        self._out.flush()
        if not ok and self._errors is not None:
            self._errors.write(line)
            self._errors.flush()
        self._bar.finished(ok, tokens)
        self._board.update(self._skipped + self._bar.done, self._bar.failed)


def _lines(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield line


class _maybe_open:
    def __init__(self, path: str | None) -> None:
        self.path = path
        self.file: IO[str] | None = None

    def __enter__(self) -> IO[str] | None:
        self.file = open(self.path, "a", encoding="utf-8") if self.path else None
        return self.file

    def __exit__(self, *exc: object) -> None:
        if self.file is not None:
            self.file.close()
