"""Reading what a job's output stream already holds, so a claiming worker continues instead of restarting.

Events are written with explicit entry ids 0-1, 0-2, ... (see publish/publisher.py). The next event's
sequence number is the last entry's + 1, and the tokens already published per sample are the
concatenation of token events.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from worker.keys import EVENT_FIELD


@dataclass
class Resume:
    next_seq: int = 1
    terminal: bool = False  # the stream already ends with done or error: never run the job again
    # sample index -> token ids already published, in order
    prior: dict[int, list[int]] = field(default_factory=dict)

    def prior_lists(self, n: int) -> list[list[int]] | None:
        if not any(self.prior.values()):
            return None
        return [self.prior.get(k, []) for k in range(n)]


def read_resume(entries: list[tuple[bytes, dict[bytes, bytes]]]) -> Resume:
    """Fold the stream's entries (XRANGE - +) into a Resume. Malformed entries are skipped, never trusted."""
    state = Resume()
    for entry_id, fields in entries:
        ms, _, seq = entry_id.partition(b"-")
        # An entry written with an auto id (an error event by a worker that never ran the job) is terminal.
        state.next_seq = int(seq) + 1 if ms == b"0" else state.next_seq
        try:
            event = json.loads(fields.get(EVENT_FIELD, b"{}"))
        except (ValueError, RecursionError):
            continue
        kind = event.get("type") if isinstance(event, dict) else None
        if kind in ("done", "error"):
            state.terminal = True
        elif kind == "token":
            tokens = state.prior.setdefault(int(event.get("sample") or 0), [])
            # Indices continue exactly; anything else would be a second writer's event and is ignored.
            if event.get("index") == len(tokens):
                tokens.extend(int(t) for t in event.get("token_ids", []))
    return state
