"""The demo's columns (worker/cli/demo_columns.py): whatever a model writes, every printed line is free of
control and zero-width characters and of U+FFFD, and each column is exactly its width in cells."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tests.helpers.columns import no_hidden_characters, split_cells
from worker.cli import demo_columns
from worker.cli.demo_columns import SEPARATOR, glyph, row, width_of, wrap

# What the tiny random model emits, and what real text holds: controls, U+FFFD, CJK and emoji (two cells),
# a combining accent, a zero-width space, a bidi override, a lone surrogate (JSON allows "\ud800").
NASTY = "ok\x08\x1b[2J\r\n\t\ufffd中文😀e\u0301\u200b\u202e\ud800\x7f end"


def test_each_character_that_moves_the_cursor_or_hides_is_escaped_as_python_writes_it():
    assert [glyph(c) for c in "\x08\x1b\r\n\t\x7f"] == ["\\x08", "\\x1b", "\\r", "\\n", "\\t", "\\x7f"]
    assert [glyph(c) for c in "\ufffd\u200b\u202e\ud800\u0301"] == [
        "\\ufffd",
        "\\u200b",
        "\\u202e",
        "\\ud800",
        "\\u0301",
    ]
    assert [glyph(c) for c in "a中😀é "] == list("a中😀é ")


def test_a_composed_accent_stays_a_letter():
    assert wrap("e\u0301t\u00e9", 12) == ["\u00e9t\u00e9"]  # NFC: e + combining acute is é


def test_wrap_breaks_at_spaces_and_splits_a_word_wider_than_the_column():
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]
    assert wrap("abcdefghijklmnopqrstuvwxyz", 10) == ["abcdefghij", "klmnopqrst", "uvwxyz"]
    # Two-cell characters: five fill ten cells; an escape is never cut in two.
    assert wrap("中文中文中文", 10) == ["中文中文中", "文"]
    assert wrap("abcdefgh\x1b", 10) == ["abcdefgh", "\\x1b"]


def test_rows_line_up_cell_for_cell():
    width = 12
    columns = [wrap(NASTY, width), wrap("plain words only here", width), wrap("中文" * 9, width)]
    lines = [row([c[k] if k < len(c) else "" for c in columns], width) for k in range(max(map(len, columns)))]
    for line in lines:
        assert no_hidden_characters(line), line
        cells = split_cells(line, width, 3)
        assert len(cells) == 3 and all(c.endswith(SEPARATOR) for c in cells[:2]), line


def test_column_width_fits_the_terminal_but_stays_wider_than_any_escape():
    assert demo_columns.column_width(80, 4) == 17  # 4 x 17 + 3 separators of 3 = 77
    assert demo_columns.column_width(20, 4) == 12


@given(st.text(), st.integers(min_value=12, max_value=40))
def test_any_text_wraps_into_safe_lines_within_the_width(text, width):
    lines = wrap(text, width)
    assert all(no_hidden_characters(line) and width_of(line) <= width for line in lines)
    # Nothing is lost: the glyphs, spaces aside, are the text's in order.
    assert "".join(lines).replace(" ", "") == "".join(demo_columns.glyphs(text)).replace(" ", "")


@given(st.text(), st.text(), st.integers(min_value=12, max_value=40))
def test_lines_already_printed_never_change_as_tokens_arrive(before, after, width):
    # The demo prints every line but the last as soon as it is complete; more text must not rewrite them.
    printed = wrap(before, width)[:-1]
    assert wrap(before + after, width)[: len(printed)] == printed
