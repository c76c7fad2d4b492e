"""A batch's `validating` step: what makes OpenAI fail a whole input file before any line runs.

Each line must be a JSON object with a non-empty string custom_id unique in the file, method POST and the
batch's endpoint as url. A line that passes these but asks for something the workers cannot honour (a
tool, a stream...) is not a file error: it runs as a line and gets its own error line (input_line.py).
"""

from __future__ import annotations

from collections.abc import Iterator

from worker.batch.api_objects import BatchError
from worker.strict_json import JSONRefused, loads_strict

MAX_REPORTED = 100  # errors listed in the batch's `errors`; the first ones are enough to fix a file
DEFAULT_MAX_LINES = 50_000  # OpenAI's limit per batch


def text_of(content: bytes) -> str:
    """A file's text; a leading byte order mark (editors on Windows write one) is not part of line 1."""
    return content.decode("utf-8-sig", errors="replace")


def input_lines(content: bytes) -> Iterator[str]:
    """The non-blank lines of a stored input file, each with its newline stripped."""
    for line in text_of(content).splitlines():
        if line.strip():
            yield line


def check_input(content: bytes, endpoint: str, max_lines: int = DEFAULT_MAX_LINES) -> list[BatchError]:
    errors: list[BatchError] = []
    seen: set[str] = set()
    count = 0
    for number, line in enumerate(text_of(content).splitlines(), start=1):
        if not line.strip():
            continue
        count += 1
        error = _check_line(line, endpoint, seen)
        if error is not None and len(errors) < MAX_REPORTED:
            errors.append(BatchError(code=error[0], message=error[1], line=number))
    if count == 0:
        errors.append(BatchError(code="empty_file", message="the input file has no lines"))
    if count > max_lines:
        errors.append(
            BatchError(code="too_many_lines", message=f"{count} lines, over the limit of {max_lines}")
        )
    return errors


def _check_line(line: str, endpoint: str, seen: set[str]) -> tuple[str, str] | None:
    try:
        entry = loads_strict(line.encode())
    except JSONRefused as exc:
        return "invalid_json_line", f"the line is refused: {exc}"
    if not isinstance(entry, dict):
        return "invalid_request", "the line is not a JSON object"
    custom_id = entry.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        return "missing_required_parameter", "custom_id must be a non-empty string"
    if custom_id in seen:
        return "duplicate_custom_id", f"custom_id {custom_id!r} is used by an earlier line"
    seen.add(custom_id)
    if entry.get("method") != "POST":
        return "invalid_method", "method must be POST"
    if entry.get("url") != endpoint:
        return "mismatched_endpoint", f"url must be the batch's endpoint {endpoint}"
    return None
