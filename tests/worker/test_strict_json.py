"""worker/strict_json.py: the one nesting limit, and what an API refuses that Python's json would take."""

from __future__ import annotations

import json

import pytest

from worker.strict_json import MAX_JSON_DEPTH, JSONRefused, loads_strict, nesting, too_deep


def test_nesting_counts_arrays_and_objects_not_brackets_in_strings():
    assert nesting(b"1") == 0 and nesting(b"[]") == 1 and nesting(b'{"a": [{"b": []}]}') == 4
    assert nesting(b'["[[[[", "\\"[[[", {"}}}": "]"}]') == 2


@pytest.mark.parametrize("deep", [MAX_JSON_DEPTH + 1, 5000, 100_000])
def test_deeper_than_the_limit_is_refused_before_parsing(deep):
    raw = b'{"a": ' + b"[" * (deep - 1) + b"]" * (deep - 1) + b"}"
    assert too_deep(raw)
    with pytest.raises(JSONRefused, match=f"deeper than {MAX_JSON_DEPTH}"):
        loads_strict(raw)


def test_at_the_limit_is_read():
    raw = b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH
    assert not too_deep(raw) and loads_strict(raw) == json.loads(raw)


def test_a_key_twice_at_any_depth_is_refused():
    with pytest.raises(JSONRefused, match="duplicate key 'model'"):
        loads_strict(b'{"model": "a", "model": "b"}')
    with pytest.raises(JSONRefused, match="duplicate key 'x'"):
        loads_strict(b'{"m": [{"x": 1, "x": 1}]}')


def test_a_lone_surrogate_is_named_by_its_path_and_a_pair_is_one_character():
    with pytest.raises(JSONRefused, match=r"^messages\.1\.content: a lone UTF-16 surrogate"):
        loads_strict(b'{"messages": [{"content": "ok"}, {"content": "a\\udc00"}]}')
    with pytest.raises(JSONRefused, match=r"^a\.'\\ud800': "):
        loads_strict(b'{"a": {"\\ud800": 1}}')
    assert loads_strict(b'"\\ud83d\\ude00"') == "\U0001f600"
    assert loads_strict(b'"\\\\ud800"') == "\\ud800"  # an escaped backslash, then text


def test_not_utf8_or_not_json_is_refused_with_a_position_in_the_given_text():
    with pytest.raises(JSONRefused, match="not UTF-8 \\(byte 9\\)"):
        loads_strict(b'{"a": "xx\xff"}')
    with pytest.raises(JSONRefused, match="column 7"):
        loads_strict(b'{"a": }')
