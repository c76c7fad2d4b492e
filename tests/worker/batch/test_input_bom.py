"""A batch input file that starts with a UTF-8 byte order mark (Windows editors write one) runs as the same
file without it: in the HTTP API's validation and driver, and in `conveyor batch`."""

from __future__ import annotations

from worker.batch.input_checks import check_input, input_lines
from worker.batch.runner import _lines

LINE = b'{"custom_id": "a", "method": "POST", "url": "/v1/completions", "body": {"prompt": "x"}}'


def test_a_leading_byte_order_mark_is_not_part_of_line_1(tmp_path):
    content = b"\xef\xbb\xbf" + LINE + b"\r\n"
    assert check_input(content, "/v1/completions") == []
    assert list(input_lines(content)) == [LINE.decode()]
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    assert [line.strip() for line in _lines(str(path))] == [LINE.decode()]


def test_a_line_nested_too_deep_is_a_line_error_not_a_crash():
    deep = b'{"custom_id": "a", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}"
    (error,) = check_input(LINE + b"\n" + deep + b"\n", "/v1/completions")
    assert (error.code, error.line) == ("invalid_json_line", 2) and "deeper than" in error.message
