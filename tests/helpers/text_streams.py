"""Feeding a TextStream the way the engine does: one token per step, until a stop string ends it."""

from __future__ import annotations

from engine.detokenizer import TextStream


def append_one_by_one(stream: TextStream, ids: list[int]) -> tuple[list[str], bool]:
    """The deltas of `stream.append([t])` for each t in turn, and whether a stop string ended them."""
    deltas, stopped = [], False
    for t in ids:
        delta, stopped = stream.append([t])
        deltas.append(delta)
        if stopped:
            break
    return deltas, stopped
