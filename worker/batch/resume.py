"""What an existing output file already answers, so a rerun skips it (and never writes a line twice).

Lines are appended whole; a crash can still leave a last line without its newline: it is cut off here
and its request runs again.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field

DUPLICATE = "duplicate_custom_id"


@dataclass
class Answered:
    custom_ids: set[str] = field(default_factory=set)  # answered by a result or an error of their own
    duplicates: Counter = field(default_factory=Counter)  # duplicate_custom_id lines already written


def read_answered(path: str) -> Answered:
    answered = Answered()
    if not os.path.exists(path):
        return answered
    _cut_partial_last_line(path)
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            custom_id = entry.get("custom_id") if isinstance(entry, dict) else None
            if not isinstance(custom_id, str):
                continue
            if (entry.get("error") or {}).get("code") == DUPLICATE:
                answered.duplicates[custom_id] += 1
            else:
                answered.custom_ids.add(custom_id)
    return answered


def _cut_partial_last_line(path: str) -> None:
    with open(path, "rb+") as f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        # Walk back to the last newline (lines are short next to the file; read in blocks).
        pos = size
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            block = f.read(step)
            cut = block.rfind(b"\n")
            if cut >= 0:
                f.truncate(pos - step + cut + 1)
                return
            pos -= step
        f.truncate(0)
