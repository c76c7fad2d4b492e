"""The demo's side-by-side columns: model text made safe to print and aligned on any terminal.

A model's text can hold anything: control characters (the tiny random model emits backspaces, escapes and
carriage returns, which move the cursor), U+FFFD where its bytes were not UTF-8, characters two cells wide
(CJK, emoji) and zero-width ones. Each character becomes a glyph of known width: a printable character as
it is, anything else escaped as Python writes it (`\\n`, `\\x1b`, `\\u200b`, `\\ufffd`), so nothing moves
the cursor and every line of a column is exactly `width` cells.
"""

from __future__ import annotations

import unicodedata

from rich.cells import get_character_cell_size

SEPARATOR = " | "
# Control, format (zero-width, bidi overrides), surrogate, private-use, unassigned, line/paragraph separators.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def glyph(char: str) -> str:
    """`char` as it is printed: itself when it takes one or two cells of its own, else its escape."""
    if char == " ":
        return char
    if (
        char == "\ufffd"
        or unicodedata.category(char) in _ESCAPED_CATEGORIES
        or get_character_cell_size(char) == 0  # combining marks left after NFC, variation selectors
    ):
        return _SHORT_ESCAPES.get(char) or char.encode("unicode_escape").decode("ascii")
    return char


def width_of(text: str) -> int:
    """Cells `text` takes, for text made of glyphs."""
    return sum(get_character_cell_size(c) for c in text)


def glyphs(text: str) -> list[str]:
    # NFC first: a letter and its combining accent become one character where Unicode has one.
    return [glyph(c) for c in unicodedata.normalize("NFC", text)]


def wrap(text: str, width: int) -> list[str]:
    """`text` as lines of at most `width` cells (width >= 10, the longest escape), broken at spaces where
    a word fits, mid-word where it does not; runs of spaces collapse as in textwrap."""
    lines: list[str] = []
    line, used = "", 0
    for word in _words(glyphs(text)):
        size = width_of("".join(word))
        if line and used + 1 + size <= width:
            line, used = line + " " + "".join(word), used + 1 + size
            continue
        if line:
            lines.append(line)
        line, used = "", 0
        for g in word:  # a word alone on its line, split where it is wider than the column
            cells = width_of(g)
            if used + cells > width:
                lines.append(line)
                line, used = "", 0
            line, used = line + g, used + cells
    if line:
        lines.append(line)
    return lines


def _words(gs: list[str]) -> list[list[str]]:
    words: list[list[str]] = [[]]
    for g in gs:
        if g == " ":
            if words[-1]:
                words.append([])
        else:
            words[-1].append(g)
    return [w for w in words if w]


def row(cells: list[str], width: int) -> str:
    """One printed line: each cell padded to `width` cells, joined by the separator, no trailing spaces."""
    return SEPARATOR.join(c + " " * (width - width_of(c)) for c in cells).rstrip()


def column_width(terminal_columns: int, num_columns: int) -> int:
    """The widest column that fits the terminal, but never narrower than 12 cells (wider than an escape)."""
    return max(12, (terminal_columns - len(SEPARATOR) * (num_columns - 1)) // num_columns)
