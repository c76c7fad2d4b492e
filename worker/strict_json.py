"""JSON from outside (an HTTP body, a batch line, an output stream's entry): one nesting limit, and the
checks that keep a parser's quirks from reaching the job.

Python's json recurses once per level and raises RecursionError near 1000 levels (fewer when called deep
in a stack), orjson refuses more than 1024: neither is a limit anyone chose, and a RecursionError is not a
ValueError, so it escaped the handlers that turn bad JSON into an error answer. MAX_JSON_DEPTH is the one
limit, checked before either parser runs (docs/http.md, docs/threat-model.md).
"""

from __future__ import annotations

import json
import re
from itertools import accumulate
from typing import Any

# Levels of arrays and objects. An OpenAI body needs about 6 (messages, their content parts, a JSON schema
# in response_format a few more); a worker's event 3.
MAX_JSON_DEPTH = 64

# A JSON string (its brackets do not nest), as an unrolled loop: one step per run of plain characters
_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_OPEN, _CLOSE = b"[{", b"]}"
_NOT_BRACKET = bytes(b for b in range(256) if b not in _OPEN + _CLOSE)
_STEP = bytes.maketrans(_OPEN + _CLOSE, b"\x02\x02\x00\x00")  # +1 / -1, offset by one
# An escaped UTF-16 surrogate: most JSON holds none, and only JSON that does is searched for a lone one.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class JSONRefused(ValueError):
    """Not JSON we take; the message says why, and where in the given text when a parser tells."""


def nesting(raw: bytes) -> int:
    """How deep `raw`'s arrays and objects nest (brackets inside strings do not count)."""
    brackets = _STRING.sub(b"", raw).translate(None, _NOT_BRACKET).translate(_STEP)
    return max(accumulate(step - 1 for step in brackets), default=0)


def too_deep(raw: bytes) -> bool:
    """Whether `raw` nests deeper than MAX_JSON_DEPTH; counting every bracket (C speed) rules out almost
    all JSON before the exact scan."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_JSON_DEPTH:
        return False
    return nesting(raw) > MAX_JSON_DEPTH


def loads_strict(raw: bytes) -> Any:
    """UTF-8 JSON as an API takes it: nested at most MAX_JSON_DEPTH deep, no key twice in an object (which
    parsers resolve differently: a proxy reading the first would see another request than we run), no lone
    UTF-16 surrogate (not a character: re-encoded for the worker, it would fail there, at a position in
    the re-encoding). NaN and Infinity are read, for the checks of finite numbers to name the field.
    Raises JSONRefused."""
    if too_deep(raw):
        raise JSONRefused(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise JSONRefused(f"not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, object_pairs_hook=_unique_keys)
    except JSONRefused:
        raise
    except (ValueError, RecursionError) as exc:  # RecursionError: only with the stack nearly full already
        raise JSONRefused(f"not JSON: {exc}") from None
    if _SURROGATE_ESCAPE.search(text):
        where = _lone_surrogate(value, "")
        if where is not None:
            raise JSONRefused(f"{where or 'the value'}: a lone UTF-16 surrogate escape is not a character")
    return value


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict:
    obj = dict(pairs)  # in C: the loop below runs only for an object that has a key twice
    if len(obj) < len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise JSONRefused(f"duplicate key {key[:64]!r}")
            seen.add(key)
    return obj


def _lone_surrogate(value: Any, path: str) -> str | None:
    """The path (`messages.0.content`) of the first string or key holding a lone surrogate; None if none.
    json.loads joins an escaped pair into one character, so a surrogate left in a str is a lone one."""
    if isinstance(value, str):
        return None if _encodes(value) else path
    if isinstance(value, dict):
        for key, item in value.items():
            if not _encodes(key):  # the key itself, written with its escape
                return f"{path}.{ascii(key)}" if path else ascii(key)
            inner = f"{path}.{key}" if path else key
            found = _lone_surrogate(item, inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for k, item in enumerate(value):
            if isinstance(item, str | dict | list):
                found = _lone_surrogate(item, f"{path}.{k}" if path else str(k))
                if found is not None:
                    return found
    return None


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
