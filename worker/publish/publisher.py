"""Writing events: the output stream (replayable) and the pub/sub channel (live), in the step's round.

Exactly once per event: each event goes in with an explicit entry id 0-<seq>, seq counting the job's
events from 1. Redis refuses an id not above the stream's last one, so if another worker took the job
over and wrote first, our write fails and we drop the job instead of writing a second history. A claiming
worker reads the last seq back from the stream (recover/resume_point.py) and continues after it.

`plan_events` turns a step's deltas into what to write (an `EventPlan`) without touching Redis, the round
or the worker; `Publisher` puts a plan's batch into a round and handles the replies.

All of a step's events go out as one script call (`WRITE`), which per job XADDs the events and only while
they succeed PUBLISHes them, refreshes the TTL and, after a terminal event, acknowledges the request
entry, deletes the job's owner, attempts (both fields, see keys.alone_field) and cancel keys, and adds the
job to its tenant's usage counters (worker/fleet/accounting.py). A worker whose lease lapsed and whose
successor wrote first therefore changes nothing: the entry stays pending for the successor (or for
whoever reclaims it if the successor dies too), and live subscribers see no second history. In a plain
MULTI the XACK would run even though the XADD before it failed (MULTI does not roll back).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import redis

from worker.config import WorkerConfig
from worker.fleet.accounting import field_suffix
from worker.keys import EVENT_FIELD
from worker.publish.event_payloads import done_event, error_event, token_event
from worker.wire.job_record import InFlight, SampleEnd
from worker.wire.lua_script import Script
from worker.wire.round import Round

_ID_TOO_SMALL = "equal or smaller"
_OOM = "OOM"  # Redis is full (noeviction): the script wrote nothing for the job; write it again later

# KEYS: requests stream, attempts hash, usage hash, then per job: output stream, owner key, cancel key.
# ARGV: group, maxlen, ttl, the event field's name, then per job: first seq, event count, expire (0|1), request entry id
#       ("" unless the last event is terminal), job id, usage field suffix ("" unless terminal), prompt tokens,
#       completion tokens, engine microseconds, the events' payloads.
# Returns per job 0 (written) or the first refused XADD's error (nothing after it was done for that job).
WRITE = """
local requests, attempts, usage = KEYS[1], KEYS[2], KEYS[3]
local group, maxlen, ttl, field = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local results, a = {}, 5
for j = 0, (#KEYS - 3) / 3 - 1 do
  local out, owner, cancel = KEYS[4 + 3 * j], KEYS[5 + 3 * j], KEYS[6 + 3 * j]
  local seq, count = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local expire, entry, job = ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local tenant_model, prompt, completion, engine_us = ARGV[a + 5], ARGV[a + 6], ARGV[a + 7], ARGV[a + 8]
  a = a + 9
  local result = 0
  for e = 0, count - 1 do
    local payload = ARGV[a + e]
    local r = redis.pcall('XADD', out, 'MAXLEN', '~', maxlen, '0-' .. (seq + e), field, payload)
    if type(r) == 'table' and r.err then
      result = r.err
      break
    end
    redis.call('PUBLISH', out, payload)
  end
  a = a + count
  if result == 0 then
    if expire == '1' then redis.call('EXPIRE', out, ttl) end
    if entry ~= '' then
      redis.pcall('XACK', requests, group, entry)
      redis.call('DEL', owner, cancel)
      redis.pcall('HDEL', attempts, job, job .. '/alone')
    end
    if tenant_model ~= '' then
      redis.call('HINCRBY', usage, 'jobs:' .. tenant_model, 1)
      redis.call('HINCRBY', usage, 'prompt_tokens:' .. tenant_model, prompt)
      redis.call('HINCRBY', usage, 'completion_tokens:' .. tenant_model, completion)
      redis.call('HINCRBY', usage, 'engine_us:' .. tenant_model, engine_us)
    end
  end
  results[j + 1] = result
end
return results
"""


@dataclass(frozen=True)
class JobWrite:
    """One job's events in one WRITE call: entries 0-<first_seq> .. 0-<first_seq + len(payloads) - 1>."""

    job: InFlight
    first_seq: int
    payloads: tuple[bytes, ...]
    expire: bool  # refresh the output stream's TTL
    entry: bytes  # the request entry to acknowledge after a terminal event, else b""
    usage: tuple = ("", 0, 0, 0)  # after a terminal event: <tenant>:<model>, prompt, completion, engine us


class Batch:
    """One step's events, every job's, for one WRITE call."""

    def __init__(self, cfg: WorkerConfig, writes: list[JobWrite] | None = None) -> None:
        self.cfg = cfg
        self.writes: list[JobWrite] = list(writes or [])

    def add(self, job: InFlight, payloads: list[bytes], terminal: bool = False) -> None:
        """After a terminal event the job is acknowledged and its bookkeeping forgotten, if it was written."""
        # The TTL counts from the last write: set it on the first event, refresh it now and then while the
        # job runs (not every step: that would be one more command per job per step), and on the last one.
        now = time.monotonic()
        expire = terminal or job.ttl_set_at is None or now - job.ttl_set_at > self.cfg.stream_ttl_s / 4
        if expire:
            job.ttl_set_at = now
        entry = job.entry_id if terminal else b""
        usage: tuple = ("", 0, 0, 0)
        if terminal:  # counted with the terminal event it rides with (worker/fleet/accounting.py)
            completion = sum(s.num_output_tokens for s in job.finished.values())
            suffix = field_suffix(job.job.tenant, self.cfg.group)
            usage = (suffix, job.prompt_tokens, completion, round(job.engine_s * 1e6))
        self.writes.append(JobWrite(job, job.next_seq, tuple(payloads), expire, entry, usage))
        job.next_seq += len(payloads)

    def keys_and_args(self) -> tuple[list, list]:
        keys = self.cfg.keys
        names: list = [keys.requests, keys.attempts, keys.usage]
        args: list = [self.cfg.group, self.cfg.stream_maxlen, self.cfg.stream_ttl_s, EVENT_FIELD]
        for w in self.writes:
            names += (keys.out(w.job.job_id), keys.owner(w.job.job_id), keys.cancel(w.job.job_id))
            args += (w.first_seq, len(w.payloads), 1 if w.expire else 0, w.entry, w.job.job_id)
            args += (*w.usage, *w.payloads)
        return names, args

    def __len__(self) -> int:
        return len(self.writes)


@dataclass
class EventPlan:
    """What one step's deltas mean for Redis and for the worker's bookkeeping."""

    batch: Batch
    done: list[InFlight] = field(default_factory=list)  # terminal event queued: forget after writing
    forget: list[str] = field(default_factory=list)  # dropped jobs whose samples all ended: forget now
    first_tokens: list[InFlight] = field(default_factory=list)  # jobs whose first token is in this plan
    has_tokens: bool = False


def plan_events(deltas, inflight: dict[str, InFlight], cfg: WorkerConfig, now_ms: float) -> EventPlan:
    """Token events per job (in delta order), a terminal event for each job whose samples have all ended.

    Writes nothing anywhere but into the plan and the jobs' own records (finished samples, first-token
    time, next event sequence number), which describe what has been produced and queued."""
    plan = EventPlan(Batch(cfg))
    by_job: dict[str, list[bytes]] = {}
    for delta in deltas:
        job = inflight.get(delta.request_id)
        if job is None:
            continue
        if delta.finished:
            job.finished[delta.sample_index] = SampleEnd(
                delta.finish_reason, delta.text or "", delta.num_output_tokens
            )
            job.prompt_tokens = max(job.prompt_tokens, delta.num_prompt_tokens)
            if delta.error and not job.error:
                job.error, job.error_code = delta.error, delta.error_code
        if job.dropped:
            if len(job.finished) == job.n:
                plan.forget.append(job.job_id)
            continue
        if delta.new_token_ids or delta.text_delta:
            by_job.setdefault(job.job_id, []).append(token_event(delta, job.n))
            if job.first_token_ms is None and delta.new_token_ids:
                job.first_token_ms = now_ms
                plan.first_tokens.append(job)
        if delta.finished and len(job.finished) == job.n:
            plan.done.append(job)
    plan.has_tokens = bool(by_job)
    for job in plan.done:
        # The ack rides in the same script call, only if the terminal event was written (see WRITE).
        # A sample whose grammar failed after admission, or whose handling raised, ends the job with an
        # error event, not done.
        last = (
            error_event(job.error_code or "invalid_params", job.error)
            if job.error
            else done_event(job, now_ms)
        )
        plan.batch.add(job, [*by_job.pop(job.job_id, ()), last], terminal=True)
    for job_id, payloads in by_job.items():
        plan.batch.add(inflight[job_id], payloads)
    return plan


class Publisher:
    """Puts each step's batch into the next round; keeps what Redis did not write for lack of memory (or
    for want of the script) to put in the round after; drops the jobs whose writes another worker's
    events refused; reports a terminal event written (its XACK with it) as acknowledged."""

    def __init__(
        self,
        on_lost: Callable[[InFlight], None],
        on_full: Callable[[str], None],
        on_acked: Callable[[InFlight], None],
        sharded_pubsub: bool = False,
    ) -> None:
        # Redis Cluster: SPUBLISH stays on the channel's shard; a PUBLISH would be copied to every node.
        self.script = Script(WRITE.replace("'PUBLISH'", "'SPUBLISH'") if sharded_pubsub else WRITE)
        self.on_lost, self.on_full, self.on_acked = on_lost, on_full, on_acked
        # Batches for the next round, in order: those sent again first, then the newest step's.
        self.owed: list[tuple[Batch, bool]] = []

    def queue(self, batch: Batch) -> None:
        if len(batch):
            self.owed.append((batch, False))

    def add_owed(self, rnd: Round) -> None:
        owed, self.owed = self.owed, []
        for batch, retried in owed:
            self.add(rnd, batch, retried)

    def add(self, rnd: Round, batch: Batch, retried: bool = False) -> None:
        if len(batch):
            keys, args = batch.keys_and_args()
            self.script.add(rnd, keys, args, lambda r: self._check(rnd, batch, r, retried))

    def _check(self, rnd: Round, batch: Batch, reply, retried: bool) -> None:
        retried = retried or rnd.retried
        if self.script.unknown(reply):  # nothing ran: send it again, with the script, next round
            self.owed.append((batch, retried))
            return
        results = [reply] * len(batch) if isinstance(reply, Exception) else reply
        again: list[JobWrite] = []
        full = ""
        for write, result in zip(batch.writes, results, strict=True):
            if result == 0:
                if write.entry:
                    self.on_acked(write.job)
                continue
            message = result.decode(errors="replace") if isinstance(result, bytes) else str(result)
            if isinstance(result, redis.OutOfMemoryError) or message.startswith(_OOM):
                again.append(write)  # nothing of this job's was written: the same ids, next round
                full = message
                continue
            # After a dropped connection the first try may have landed: the conflict is then our own write.
            if retried and _ID_TOO_SMALL in message:
                if write.entry:
                    self.on_acked(write.job)
                continue
            self.on_lost(write.job)
        if again:
            self.on_full(full)
            self.owed.append((Batch(batch.cfg, again), retried))
