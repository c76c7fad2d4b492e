"""run_on_ranks whose results come back by value.

multiprocessing's queue pickles tensors by handing over shared memory that the sending rank must still be
alive to serve; a rank that has already exited makes unpickling fail. Pickling the result in the rank
(plain pickle copies tensor storage into the bytes) removes that race.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

from engine.distributed.group import TPGroup
from tests.helpers.tp_ranks import run_on_ranks


def _pickled(group: TPGroup, fn: Callable[..., Any], *args: Any) -> bytes:
    return pickle.dumps(fn(group, *args))


def values_on_ranks(size: int, fn: Callable[..., Any], *args: Any) -> list[Any]:
    """fn(group, *args) on ranks 0..size-1 (see run_on_ranks), results copied by value."""
    return [pickle.loads(b) for b in run_on_ranks(size, _pickled, fn, *args)]
