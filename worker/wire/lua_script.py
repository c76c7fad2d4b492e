"""Our own Lua scripts, called with EVALSHA inside a step's MULTI, so a step stays one round trip.

Only script bodies written here are ever loaded; what clients send reaches a script as ARGV data, never as
code (docs/threat-model.md). The body is loaded by a SCRIPT LOAD queued in front of the first call; a
Redis restart or SCRIPT FLUSH forgets it, the call then answers NOSCRIPT having run nothing, and the
caller queues it again with `reload()` done.
"""

from __future__ import annotations

import hashlib

import redis

from worker.wire.round import Handler, Round


class Script:
    def __init__(self, body: str) -> None:
        self.body = body
        self.sha = hashlib.sha1(body.encode()).hexdigest()
        self.loaded = False  # whether a SCRIPT LOAD went out since the last NOSCRIPT

    def add(self, rnd: Round, keys: list, args: list, on_result: Handler) -> None:
        if not self.loaded:
            rnd.raw(("SCRIPT", "LOAD", self.body))
            self.loaded = True
        rnd.raw(("EVALSHA", self.sha, len(keys), *keys, *args), on_result)

    def unknown(self, reply) -> bool:
        """True (and load it again next time) when Redis did not know the script: nothing ran."""
        if isinstance(reply, redis.exceptions.NoScriptError):
            self.loaded = False
            return True
        return False
