"""Stream an OpenAI Batch file through the workers with a bounded number of jobs in flight.

    input line ─▶ parse ─▶ XADD job ─▶ (≤ max_in_flight) ─▶ XREAD out:<id> … ─▶ terminal event ─▶ sink

The one runner of both `conveyor batch` (lines from a local file, answers to local files: file_sink.py) and
the HTTP API's batches (lines from the file store, answers to Redis under a lease: redis_sink.py, driven by
driver.py). Memory: the jobs in flight plus the set of custom_ids seen (needed to refuse duplicates and to
resume). The queue is one Redis or a Redis Cluster's shards (worker/job_queue.py): in a cluster each job goes
to its shard and its events are read there. Job ids are derived from the line (or, for the HTTP API, from
the batch id and the custom_id), so a rerun after a crash re-enqueues the same ids: the workers deduplicate
them and the runner reads the events of the run it lost.

A sink may ask the run to stop (cancelled, past its deadline): no more lines are submitted, the jobs in
flight are cancelled and collected for up to `drain_s`, and every line still unanswered gets an error line
with the stop's code.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

from worker.batch.file_sink import FileSink
from worker.batch.input_line import BatchRequest, job_id_for, parse_custom_id, parse_line
from worker.batch.output_line import from_event, line_error
from worker.batch.resume import DUPLICATE
from worker.batch.sink import Sink, Stop
from worker.client import NoAnswer
from worker.job_queue import Cursor, JobQueue, read_outputs
from worker.keys import EVENT_FIELD
from worker.openai.echo import PromptScores
from worker.openai.logprobs import SampleLogprobs
from worker.openai.request import RequestError
from worker.protocol import TokenEvent, read_event

CANCEL_KEY_TTL_S = 600  # as docs/protocol.md's example: long enough for any worker to see it


@dataclass
class _InFlight:
    request: BatchRequest
    cursor: Cursor
    # Per sample, when the line asked for logprobs: gathered from the token events (the done event has none).
    logprobs: dict[int, SampleLogprobs] | None = None
    # The prompt's logprobs, when the line asked (echo, prompt_logprobs): from the first token event.
    prompt: PromptScores | None = None


@dataclass(frozen=True)
class BatchSummary:
    total: int
    skipped: int  # answered by an earlier run
    done: int
    failed: int
    completion_tokens: int


@dataclass(frozen=True)
class JobTemplate:
    """What a run puts into each line's job beyond the line itself."""

    # (custom_id, line) -> job id; the default names a job by its line (`conveyor batch`).
    job_id: Callable[[str, str], str] = lambda custom_id, line: job_id_for(line)
    fields: dict = field(default_factory=dict)  # e.g. tenant, deadline_ms
    # How a line's job is queued: the shard whose output stream will hold its events; may raise RequestError
    # (the line is answered with it). None: `queue.submit(job)`, the queue's own stream.
    submit: Callable[[JobQueue, BatchRequest], int] | None = None


@dataclass
class _Tally:
    done: int = 0
    failed: int = 0
    tokens: int = 0


class BatchRunner:
    def __init__(
        self,
        queue: JobQueue,
        max_in_flight: int = 256,
        block_ms: int = 1000,
        progress: bool | None = None,
        idle_timeout_s: float = 0.0,
        drain_s: float = 10.0,
    ) -> None:
        if max_in_flight < 1:
            raise ValueError("max_in_flight must be >= 1")
        self.queue = queue
        # Jobs in flight and no event for this long: raise NoAnswer (0: wait for ever).
        self.idle_timeout_s = idle_timeout_s
        self.drain_s = drain_s
        self._last_event = time.monotonic()
        self.max_in_flight, self.block_ms, self.progress = max_in_flight, block_ms, progress

    def run(
        self,
        input_path: str,
        output_path: str,
        errors_path: str | None = None,
        template: JobTemplate | None = None,
    ) -> BatchSummary:
        """`conveyor batch`: a local input file, answers appended to local files; rerun to resume."""
        sink = FileSink(output_path, errors_path, self.progress)
        # Seen by `conveyor top` and the dashboard (worker/fleet/batch_board.py).
        sink.show_on(self.queue.node(0), self.queue.keys(0).batches, os.path.basename(input_path))
        try:
            return self.drive(lambda: _lines(input_path), sink, template)
        finally:
            sink.close()

    def drive(
        self, lines: Callable[[], Iterable[str]], sink: Sink, template: JobTemplate | None = None
    ) -> BatchSummary:
        """Run every line of `lines()` (called twice: once to count) not answered in `sink` yet."""
        template = template or JobTemplate()
        answered = sink.answered()
        total = skipped = 0
        for line in lines():
            total += 1
            skipped += parse_custom_id(line) in answered.custom_ids
        sink.started(total, skipped)
        self._sink, self._tally, self._written = sink, _Tally(), set[str]()
        self._last_event = time.monotonic()
        inflight: dict[str, _InFlight] = {}
        seen: set[str] = set()
        stop: Stop | None = None
        for line in lines():
            stop = sink.stop()
            if stop is not None:
                break
            custom_id = parse_custom_id(line)
            if custom_id is not None and custom_id in seen:
                if answered.duplicates[custom_id] > 0:
                    answered.duplicates[custom_id] -= 1
                else:
                    message = "custom_id already used by an earlier line"
                    self._write(custom_id, line_error(custom_id, DUPLICATE, message), False)
                continue
            if custom_id is not None:
                seen.add(custom_id)
                if custom_id in answered.custom_ids:
                    continue
            try:
                request = parse_line(line, template.job_id(custom_id or "", line), template.fields)
            except RequestError as exc:
                self._write(custom_id or "", line_error(custom_id or "", exc.code, exc.message), False)
                continue
            while len(inflight) >= self.max_in_flight and stop is None:
                self._collect(inflight)
                stop = sink.stop()
            if stop is not None:
                break
            try:
                shard = (
                    template.submit(self.queue, request)
                    if template.submit
                    else self.queue.submit(request.job.wire())
                )
            except RequestError as exc:
                self._write(request.custom_id, line_error(request.custom_id, exc.code, exc.message), False)
                continue
            wants = request.job.logprobs is not None
            inflight[self.queue.keys(shard).out(request.job.id)] = _InFlight(
                request, Cursor(shard), logprobs={} if wants else None
            )
        while inflight and stop is None:
            self._collect(inflight)
            stop = sink.stop()
        if stop is not None:
            self._wind_down(inflight, lines, answered.custom_ids, stop)
        t = self._tally
        return BatchSummary(total, skipped, t.done, t.failed, t.tokens)

    def _wind_down(
        self,
        inflight: dict[str, _InFlight],
        lines: Callable[[], Iterable[str]],
        answered_before: set[str],
        stop: Stop,
    ) -> None:
        """Cancel the jobs in flight, collect what they end with for up to drain_s, then answer every line
        still unanswered with the stop's error."""
        for pending in inflight.values():
            job_id, node = pending.request.job.id, self.queue.node(pending.cursor.shard)
            keys = self.queue.keys(pending.cursor.shard)
            node.set(keys.cancel(job_id), 1, ex=CANCEL_KEY_TTL_S)
            node.publish(keys.cancel_channel, job_id)
        until = time.monotonic() + self.drain_s
        while inflight and time.monotonic() < until:
            self._collect(inflight)
        for line in lines():
            custom_id = parse_custom_id(line)
            if custom_id is None or custom_id in answered_before or custom_id in self._written:
                continue
            self._write(custom_id, line_error(custom_id, stop.code, stop.message), False)

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
                # An entry no worker writes (not an event) ends its line as internal_error, as the
                # gateway answers it: nothing in one stream may stop the run.
                event = read_event(fields.get(EVENT_FIELD))
                if isinstance(event, TokenEvent):
                    if pending.logprobs is not None:
                        pending.logprobs.setdefault(event.sample or 0, SampleLogprobs()).add(event)
                    if event.prompt_logprobs is not None:
                        pending.prompt = PromptScores.of(event)
                else:
                    r = pending.request
                    line, ok, tokens = from_event(
                        r.custom_id,
                        r.url,
                        r.model,
                        r.job.id,
                        event,
                        pending.logprobs,
                        r.echo,
                        pending.prompt,
                    )
                    self._write(r.custom_id, line, ok, tokens)
                    del inflight[key]
                    break

    def _write(self, custom_id: str, line: str, ok: bool, tokens: int = 0) -> None:
        self._sink.write(custom_id, line, ok, tokens)
        self._written.add(custom_id)
        if ok:
            self._tally.done += 1
        else:
            self._tally.failed += 1
        self._tally.tokens += tokens


def _lines(path: str) -> Iterator[str]:
    with open(path, encoding="utf-8-sig") as f:  # -sig: a leading byte order mark is not part of line 1
        for line in f:
            if line.strip():
                yield line
