"""Stop strings found in streamed text, across token boundaries, with held-back text.

Rule: the text ends just before the first stop string to *complete* (earliest end; on a tie the one that
starts first). While streaming, the longest tail that is a proper prefix of some stop string is held back,
and released once it can no longer become one (or by `flush()` when the request ends otherwise). Emitted text
only ever grows and depends only on the text fed, not on how it was split into deltas; the deltas (plus
`flush()`) concatenate to the final text.
"""

from __future__ import annotations


class StopStrings:
    def __init__(self, stop: list[str]):
        if any(s == "" for s in stop):
            raise ValueError("stop strings must not be empty")
        self.stop = list(stop)
        self._max_hold = max((len(s) for s in stop), default=1) - 1
        self._held = ""  # fed but not emitted: a possible beginning of a stop string
        self.stopped = False

    def feed(self, delta: str) -> tuple[str, bool]:
        """Take newly decoded text; return (text safe to emit, whether a stop string was found)."""
        if self.stopped:
            return "", True
        if not self.stop:
            return delta, False
        buffer = self._held + delta
        # Emitted text cannot hold the start of a match (it was no stop prefix), so search the buffer only.
        best_end, best_start = None, None
        for s in self.stop:
            start = buffer.find(s)
            if start >= 0 and (best_end is None or (start + len(s), start) < (best_end, best_start)):
                best_end, best_start = start + len(s), start
        if best_start is not None:
            self.stopped, self._held = True, ""
            return buffer[:best_start], True
        hold = self._hold_length(buffer)
        self._held = buffer[len(buffer) - hold :]
        return buffer[: len(buffer) - hold], False

    def _hold_length(self, buffer: str) -> int:
        for n in range(min(len(buffer), self._max_hold), 0, -1):
            tail = buffer[-n:]
            if any(s.startswith(tail) for s in self.stop):
                return n
        return 0

    def flush(self) -> str:
        """The request ended for another reason (length, EOS, abort): release the held-back text."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
