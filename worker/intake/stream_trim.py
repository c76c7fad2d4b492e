"""Trimming the requests stream: acknowledged jobs keep their full prompt in it until someone removes them.

Every `every_s` the loop adds one script call to its round. The script finds, for every consumer group of
the stream, the oldest entry that group still needs: its oldest pending entry, or else the first entry
after its last-delivered id. `XTRIM MINID` then removes only what lies below the oldest of those, so an
entry is never trimmed while any group (another model's workers, a lagging one) has not read or finished
it. The script runs inside Redis, so no group moves between the look and the trim.
"""

from __future__ import annotations

import time

import structlog

from worker.wire.lua_script import Script
from worker.wire.round import Round

log = structlog.get_logger("conveyor.trim")

# KEYS: the requests stream. Returns nil (no stream or no group yet) or {min id kept, entries removed}.
TRIM = """
local stream = KEYS[1]
if redis.call('EXISTS', stream) == 0 then return false end
local groups = redis.call('XINFO', 'GROUPS', stream)
if #groups == 0 then return false end
local function parse(id)
  local dash = string.find(id, '-', 1, true)
  return tonumber(string.sub(id, 1, dash - 1)), tonumber(string.sub(id, dash + 1))
end
local floor_ms, floor_seq
for _, g in ipairs(groups) do
  local name, last
  for i = 1, #g, 2 do
    if g[i] == 'name' then name = g[i + 1] elseif g[i] == 'last-delivered-id' then last = g[i + 1] end
  end
  local ms, seq = parse(last)
  seq = seq + 1
  local pending = redis.call('XPENDING', stream, name)
  if pending[1] > 0 then ms, seq = parse(pending[2]) end
  if floor_ms == nil or ms < floor_ms or (ms == floor_ms and seq < floor_seq) then
    floor_ms, floor_seq = ms, seq
  end
end
local minid = string.format('%d-%d', floor_ms, floor_seq)
return {minid, redis.call('XTRIM', stream, 'MINID', minid)}
"""


class Trimmer:
    def __init__(self, stream: str, every_s: float = 60.0) -> None:
        self.stream, self.every_s = stream, every_s
        self.script = Script(TRIM)
        self._last = time.monotonic()

    def due(self) -> bool:
        return time.monotonic() - self._last >= self.every_s

    def add(self, rnd: Round) -> None:
        self._last = time.monotonic()
        self.script.add(rnd, [self.stream], [], self._check)

    def _check(self, reply) -> None:
        if self.script.unknown(reply) or isinstance(reply, Exception) or not reply:
            return  # tried again at the next interval
        kept_from, removed = reply
        if removed:
            log.info("requests stream trimmed", removed=removed, kept_from=kept_from.decode())
