"""Reading the demo's side-by-side columns back (worker/cli/demo_columns.py), as a terminal shows them."""

from __future__ import annotations

import unicodedata

from worker.cli.demo_columns import SEPARATOR, width_of


def no_hidden_characters(line: str) -> bool:
    """No control, format, unassigned or line-separating character, no U+FFFD, nothing zero cells wide."""
    return all(
        unicodedata.category(c)[0] != "C"
        and unicodedata.category(c) not in ("Zl", "Zp")
        and c != "\ufffd"
        and width_of(c) > 0
        for c in line
    )


def split_cells(line: str, width: int, count: int) -> list[str]:
    """`line` cut where `row` ends each of its `count` columns (each but the last followed by the
    separator), counting cells; a character across a column's edge fails."""
    spans = [width + len(SEPARATOR)] * (count - 1) + [width]
    parts: list[str] = []
    part, used = "", 0
    for c in line + " " * sum(spans):  # row() strips trailing spaces
        if len(parts) == count:
            break
        part, used = part + c, used + width_of(c)
        if used >= spans[len(parts)]:
            assert used == spans[len(parts)], f"a character across a column's edge: {line!r}"
            parts.append(part)
            part, used = "", 0
    return parts


def table(screen: str, ids: list[str]) -> tuple[int, list[str]]:
    """The column width and the rows under the header line (which names `ids`), up to the first blank line."""
    lines = screen.splitlines()
    head = next(k for k, line in enumerate(lines) if line.startswith(ids[0] + " "))
    header = lines[head]
    width = len(header.split(SEPARATOR)[0])
    assert header.split(SEPARATOR)[0].rstrip() == ids[0], header
    rows = []
    for line in lines[head:]:
        if not line.strip():
            break
        rows.append(line)
    return width, rows


def assert_aligned(screen: str, ids: list[str]) -> int:
    """Every row of the table is clean and splits into the columns at the header's separators; returns
    how many rows of text there are."""
    width, rows = table(screen, ids)
    for line in rows:
        assert no_hidden_characters(line), line
        cells = split_cells(line, width, len(ids))
        assert all(c.endswith(SEPARATOR) for c in cells[:-1]), f"misaligned: {line!r}"
    assert [c.removesuffix(SEPARATOR).strip() for c in split_cells(rows[0], width, len(ids))] == ids
    return len(rows) - 1
