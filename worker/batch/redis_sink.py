"""The HTTP API's sink: a batch's output lines in Redis lists, written only while this replica holds the
batch's lease, each custom_id at most once.

    <prefix>:batch:{<id>}:answered   set of the custom_ids written (what a takeover skips)
    <prefix>:batch:{<id>}:output     list: lines of requests that succeeded (the output file)
    <prefix>:batch:{<id>}:errors     list: lines of requests that failed (the error file)

One Lua call per line checks the lease token, adds the custom_id to `answered` and, only if it was not there,
appends the line and counts it in the batch hash (completed / failed): a replica that lost its lease, or a
second answer for the same custom_id, writes nothing.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import redis

from worker.batch.batch_lease import BatchLease, Handover
from worker.batch.batch_store import LeaseLost
from worker.batch.resume import Answered
from worker.batch.sink import EXPIRED, Stop
from worker.fleet.batch_board import BatchBoard
from worker.keys import Keys

# KEYS: lease, answered, output, errors, batch hash. ARGV: token, custom_id, line, 1 (ok) or 0.
_WRITE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
if redis.call('SADD', KEYS[2], ARGV[2]) == 0 then return 0 end
if ARGV[4] == '1' then
  redis.call('RPUSH', KEYS[3], ARGV[3])
  redis.call('HINCRBY', KEYS[5], 'completed', 1)
else
  redis.call('RPUSH', KEYS[4], ARGV[3])
  redis.call('HINCRBY', KEYS[5], 'failed', 1)
end
return 1
"""
_TOTAL = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
redis.call('HSET', KEYS[2], 'total', ARGV[2])
return 1
"""
CANCELLED = Stop("batch_cancelled", "the batch was cancelled before this request ran")


class RedisSink:
    def __init__(
        self,
        client: redis.Redis,
        keys: Keys,
        batch_id: str,
        lease: BatchLease,
        expires_at: int,
        check_every_s: float = 0.25,
        leaving: threading.Event | None = None,
        board_key: str | None = None,
    ) -> None:
        """`leaving`: set when this replica stops; the run then ends with Handover. `board_key`: the batch
        board's hash (Keys.batches), where `conveyor top` and the dashboard see the batch's progress."""
        self.client, self.lease = client, lease
        self.batch_key = keys.batch(batch_id)
        self._keys = [lease.key, *(keys.batch(batch_id, p) for p in ("answered", "output", "errors"))]
        self._keys.append(self.batch_key)
        self._write = client.register_script(_WRITE)
        self._total = client.register_script(_TOTAL)
        self.expires_at, self.check_every_s, self.leaving = expires_at, check_every_s, leaving
        self._checked = 0.0
        self.batch_id, self.board_key = batch_id, board_key
        self.board: BatchBoard | None = None
        self._counts = [0, 0, 0]  # answered by earlier runs, succeeded, failed (this run)
        self._stop: Stop | None = None

    def answered(self) -> Answered:
        members: Any = self.client.smembers(self._keys[1])
        return Answered(custom_ids={m.decode() if isinstance(m, bytes) else m for m in members})

    def started(self, total: int, skipped: int) -> None:
        if self._total(keys=[self.lease.key, self.batch_key], args=[self.lease.token, total]) == -1:
            raise LeaseLost(self.batch_key)
        self._counts[0] = skipped
        if self.board_key is not None:
            self.board = BatchBoard(self.client, self.board_key, self.batch_id, total)
            self.board.update(skipped, 0, force=True)

    def write(self, custom_id: str, line: str, ok: bool, tokens: int) -> None:
        args = [self.lease.token, custom_id, line, "1" if ok else "0"]
        if self._write(keys=self._keys, args=args) == -1:
            raise LeaseLost(self.batch_key)
        self._counts[1 if ok else 2] += 1
        if self.board is not None:
            self.board.update(self._counts[0] + self._counts[1], self._counts[2])

    def close(self) -> None:
        """Off the batch board (the batch's own record keeps its counts)."""
        if self.board is not None:
            self.board.close()

    def stop(self) -> Stop | None:
        """At most every check_every_s: renew the lease (LeaseLost when gone), then cancelled? expired?
        Raises Handover once the replica is leaving."""
        if self.leaving is not None and self.leaving.is_set():
            raise Handover(self.batch_key)
        now = time.monotonic()
        if self._stop is not None or now - self._checked < self.check_every_s:
            return self._stop
        self._checked = now
        if not self.lease.keep():
            raise LeaseLost(self.batch_key)
        status: Any = self.client.hget(self.batch_key, "status")
        if status in (b"cancelling", "cancelling"):
            self._stop = CANCELLED
        elif time.time() >= self.expires_at:
            self._stop = EXPIRED
        return self._stop
