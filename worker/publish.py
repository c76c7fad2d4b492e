"""Writing events: the output stream (replayable) and the pub/sub channel (live), in the step's round.

Exactly once per event: each event goes in with an explicit entry id 0-<seq>, seq counting the job's
events from 1. Redis refuses an id not above the stream's last one, so if another worker took the job
over and wrote first, our write fails and we drop the job instead of writing a second history. A claiming
worker reads the last seq back from the stream (resume.py) and continues after it.

All of a step's events go out as one script call (`WRITE`), which per job XADDs the events and only while
they succeed PUBLISHes them, refreshes the TTL and, after a terminal event, acknowledges the request
entry and deletes the job's owner, attempts and cancel keys. A worker whose lease lapsed and whose
successor wrote first therefore changes nothing: the entry stays pending for the successor (or for
whoever reclaims it if the successor dies too), and live subscribers see no second history. In a plain
MULTI the XACK would run even though the XADD before it failed (MULTI does not roll back).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from worker.config import WorkerConfig
from worker.errors import JobError
from worker.events import error_event
from worker.keys import EVENT_FIELD
from worker.lease import add_release
from worker.round import Round
from worker.script import Script
from worker.state import InFlight

_ID_TOO_SMALL = "equal or smaller"

# KEYS: requests stream, attempts hash, then per job: output stream, owner key, cancel key.
# ARGV: group, maxlen, ttl, the event field's name, then per job: first seq, event count, expire (0|1), request entry id
#       ("" unless the last event is terminal), job id, the events' payloads.
# Returns per job 0 (written) or the first refused XADD's error (nothing after it was done for that job).
WRITE = """
local requests, attempts = KEYS[1], KEYS[2]
local group, maxlen, ttl, field = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local results, a = {}, 5
for j = 0, (#KEYS - 2) / 3 - 1 do
  local out, owner, cancel = KEYS[3 + 3 * j], KEYS[4 + 3 * j], KEYS[5 + 3 * j]
  local seq, count = tonumber(ARGV[a]), tonumber(ARGV[a + 1])
  local expire, entry, job = ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  a = a + 5
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
      redis.pcall('HDEL', attempts, job)
    end
  end
  results[j + 1] = result
end
return results
"""


class Batch:
    """One step's events, every job's, for one WRITE call."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.cfg = cfg
        self.jobs: list[InFlight] = []
        self.keys: list[str] = [cfg.keys.requests, cfg.keys.attempts]
        self.args: list = [cfg.group, cfg.stream_maxlen, cfg.stream_ttl_s, EVENT_FIELD]

    def add(self, job: InFlight, payloads: list[bytes], terminal: bool = False) -> None:
        """After a terminal event the job is acknowledged and its bookkeeping forgotten, if it was written."""
        keys = self.cfg.keys
        # The TTL counts from the last write: set it on the first event, refresh it now and then while the
        # job runs (not every step: that would be one more command per job per step), and on the last one.
        now = time.monotonic()
        expire = terminal or job.ttl_set_at is None or now - job.ttl_set_at > self.cfg.stream_ttl_s / 4
        if expire:
            job.ttl_set_at = now
        entry = job.entry_id if terminal else b""
        self.jobs.append(job)
        self.keys += (keys.out(job.job_id), keys.owner(job.job_id), keys.cancel(job.job_id))
        self.args += (job.next_seq, len(payloads), 1 if expire else 0, entry, job.job_id, *payloads)
        job.next_seq += len(payloads)

    def __len__(self) -> int:
        return len(self.jobs)


class Publisher:
    """Adds batches to rounds and drops the jobs whose writes another worker's events refused."""

    def __init__(self, on_lost: Callable[[InFlight], None], next_round: Callable[[], Round]) -> None:
        self.script = Script(WRITE)
        self.on_lost, self.next_round = on_lost, next_round

    def add(self, rnd: Round, batch: Batch, retried: bool = False) -> None:
        if len(batch):
            self.script.add(rnd, batch.keys, batch.args, lambda r: self._check(rnd, batch, r, retried))

    def _check(self, rnd: Round, batch: Batch, reply, retried: bool) -> None:
        retried = retried or rnd.retried
        if self.script.unknown(reply):  # nothing ran: send it again, with the script, next round
            self.add(self.next_round(), batch, retried)
            return
        results = [reply] * len(batch) if isinstance(reply, Exception) else reply
        for job, result in zip(batch.jobs, results, strict=True):
            if result == 0:
                continue
            message = result.decode(errors="replace") if isinstance(result, bytes) else str(result)
            # After a dropped connection the first try may have landed: the conflict is then our own write.
            if retried and _ID_TOO_SMALL in message:
                continue
            self.on_lost(job)


def add_ack(rnd: Round, cfg: WorkerConfig, entry_id: bytes) -> None:
    rnd.add(lambda p: p.xack(cfg.keys.requests, cfg.group, entry_id))


def add_failure(
    rnd: Round, cfg: WorkerConfig, entry_id: bytes, error: JobError, raw: bytes | None, owned: bool
) -> None:
    """A job that will not run: error event (when it has an id), a dead-letter copy, then the ack."""
    if error.job_id is not None:
        key = cfg.keys.out(error.job_id)
        payload = error_event(error.code.value, error.message)
        # An auto id: above any 0-<seq> a previous attempt wrote, and terminal for resume.py.
        rnd.add(lambda p: p.xadd(key, {EVENT_FIELD: payload}, maxlen=cfg.stream_maxlen, approximate=True))
        rnd.add(lambda p: p.publish(key, payload))
        rnd.add(lambda p: p.expire(key, cfg.stream_ttl_s))
    dead = {
        b"entry_id": entry_id,
        b"code": error.code.value,
        b"reason": error.message[:2000],
        b"consumer": cfg.consumer,
        b"job": (raw or b"")[: cfg.limits.max_payload_bytes],
    }
    if error.job_id is not None:
        dead[b"id"] = error.job_id
    rnd.add(lambda p: p.xadd(cfg.keys.dead, dead, maxlen=cfg.dead_maxlen, approximate=True))
    add_ack(rnd, cfg, entry_id)
    if owned and error.job_id is not None:
        add_release(rnd, cfg, error.job_id)
        _forget(rnd, cfg, error.job_id)


def _forget(rnd: Round, cfg: WorkerConfig, job_id: str) -> None:
    rnd.add(lambda p: p.hdel(cfg.keys.attempts, job_id))
    cancel_key = cfg.keys.cancel(job_id)
    rnd.add(lambda p: p.delete(cancel_key))
