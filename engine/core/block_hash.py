"""Chained hash of one full KV block: H(parent hash, token ids). Pure Python, no torch."""

from __future__ import annotations

import hashlib
import sys
from array import array
from collections.abc import Callable, Sequence

BlockHash = bytes
# (parent hash or None for the first block, the block's token ids) -> hash.
HashFn = Callable[[BlockHash | None, Sequence[int]], BlockHash]

_ROOT = b"conveyor-kv-root"


def hash_block_tokens(parent: BlockHash | None, token_ids: Sequence[int]) -> BlockHash:
    """128-bit blake2b over the parent hash and the ids as little-endian int64, so the value is stable
    across runs and machines (Python's hash() is salted per process)."""
    ids = array("q", token_ids)
    if sys.byteorder != "little":
        ids.byteswap()
    h = hashlib.blake2b(parent if parent is not None else _ROOT, digest_size=16)
    h.update(ids.tobytes())
    return h.digest()
