"""A bounded, non-recursive look at raw payload bytes, before (or instead of) parsing them as JSON.

Two questions are answered without `json.loads`, which recurses once per nesting level and raises
RecursionError on a 20 KB `[[[[...]]]]`: how deeply the payload nests (refused past MAX_JSON_DEPTH), and
which `id` its top-level object names, so a job whose bytes cannot be parsed (not UTF-8, lone surrogates,
too deep, truncated) is still answered on its output stream.

The scan walks tokens (strings and the six structural characters) with one regular expression; it never
decodes the payload as a whole, so bytes that are not UTF-8 outside the id do not hide it.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from worker.strict_json import MAX_JSON_DEPTH  # the one limit: jobs, bodies, batch lines and events

__all__ = ["MAX_JSON_DEPTH", "scan_payload"]

# A JSON string (escapes included, unterminated ones not matched), a bracket or a colon. Numbers, literals
# and commas are not tokens (a list of 8k token ids is two tokens); a key is a string followed by a colon,
# and the id's value must follow its colon with nothing but whitespace between.
_TOKEN_RE = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[{}\[\]:]', re.DOTALL)
_OPEN, _CLOSE = frozenset(b"{["), frozenset(b"}]")


@dataclass(frozen=True)
class Scan:
    too_deep: bool  # nesting went past MAX_JSON_DEPTH (the scan stopped there)
    job_id: str | None  # the top-level object's `id` string, when it names exactly one


def scan_payload(raw: bytes, id_pattern: re.Pattern[str]) -> Scan:
    """Depth and top-level id of `raw`, in one pass that stops at the first level past the limit (an id
    written after that point is not found)."""
    depth, ids = 0, set[str | None]()
    # The last three tokens at depth 1 of an object: `"id"`, `:`, `"value"` names the id.
    recent: list[re.Match[bytes]] = []
    top_is_object = raw.lstrip()[:1] == b"{"
    for match in _TOKEN_RE.finditer(raw):
        token = match.group()
        first = token[0]
        if first in _OPEN:
            depth += 1
            if depth > MAX_JSON_DEPTH:
                return Scan(too_deep=True, job_id=_one(ids))
        elif first in _CLOSE:
            depth -= 1
        if depth != 1 or not top_is_object:
            recent.clear()
            continue
        recent = [*recent[-2:], match]
        if len(recent) == 3 and _names_id(raw, *recent):
            ids.add(_decode_id(token, id_pattern))
    return Scan(too_deep=False, job_id=_one(ids))


def _names_id(raw: bytes, key: re.Match[bytes], colon: re.Match[bytes], value: re.Match[bytes]) -> bool:
    return (
        (key.group() == b'"id"' or (b"\\" in key.group() and _string(key.group()) == "id"))
        and colon.group() == b":"
        and value.group()[:1] == b'"'
        and not raw[colon.end() : value.start()].strip()
    )


def _decode_id(token: bytes, id_pattern: re.Pattern[str]) -> str | None:
    value = _string(token)
    return value if value is not None and id_pattern.match(value) else None


def _string(token: bytes) -> str | None:
    """One JSON string token's value (escapes resolved), or None when it is not UTF-8 or not valid."""
    try:
        value = json.loads(token.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return None
    return value if isinstance(value, str) else None


def _one(ids: set[str | None]) -> str | None:
    """An id given twice with two values names no one stream: nothing is answered then."""
    return next(iter(ids)) if len(ids) == 1 else None
