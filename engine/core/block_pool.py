"""The pool of fixed-size KV blocks: reference counts, an LRU free list and the prefix-cache map.

A block with ref_cnt 0 sits in the free list but keeps its hash, so a later request can still hit it
until it is handed out for other content (evicted), which is the moment its hash mapping is dropped.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from engine.core.block_hash import BlockHash


@dataclass(eq=False)
class KVBlock:
    block_id: int
    ref_cnt: int = 0
    # Set only while the prefix-cache map points at this block (so the map never goes stale).
    block_hash: BlockHash | None = None
    # The block's token ids, compared on a hit so a hash collision never shares wrong KV.
    token_ids: tuple[int, ...] | None = None


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [KVBlock(i) for i in range(num_blocks)]
        # LRU order, least recently used first; an OrderedDict gives O(1) removal from the middle.
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[BlockHash, KVBlock] = {}

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    @property
    def num_free(self) -> int:
        """Blocks with ref_cnt 0, cached ones included (they are evictable)."""
        return len(self._free)

    @property
    def num_cached(self) -> int:
        return len(self._cached)

    def free_order(self) -> list[int]:
        """Free block ids, next to be handed out first."""
        return list(self._free)

    def take(self) -> KVBlock | None:
        """A block for new content (ref_cnt 1), evicting the least recently used one; None if all in use."""
        if not self._free:
            return None
        block_id, _ = self._free.popitem(last=False)
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self._cached[block.block_hash]
            block.block_hash = None
            block.token_ids = None
        block.ref_cnt = 1
        return block

    def touch(self, block: KVBlock) -> None:
        """One more holder of a block (a prefix hit or a fork); takes it off the free list if it was there."""
        if block.ref_cnt == 0:
            del self._free[block.block_id]
        block.ref_cnt += 1

    def release(self, block: KVBlock) -> None:
        """One holder fewer; at 0 the block goes to the tail of the free list (most recently used)."""
        block.ref_cnt -= 1
        if block.ref_cnt == 0:
            self._free[block.block_id] = None

    def lookup(self, block_hash: BlockHash, token_ids: Sequence[int]) -> KVBlock | None:
        block = self._cached.get(block_hash)
        if block is None or block.token_ids != tuple(token_ids):
            return None
        return block

    def cache(self, block: KVBlock, block_hash: BlockHash, token_ids: Sequence[int]) -> bool:
        """Register a full block; False when the hash already names another block (the first one stays)."""
        if block.block_hash is not None or block_hash in self._cached:
            return False
        block.block_hash = block_hash
        block.token_ids = tuple(token_ids)
        self._cached[block_hash] = block
        return True

    def check_invariants(self, holders: dict[int, int]) -> None:
        """`holders`: block id -> number of block tables holding it. Raises AssertionError on a mismatch."""
        for block in self.blocks:
            n = holders.get(block.block_id, 0)
            assert block.ref_cnt == n, f"block {block.block_id}: ref_cnt {block.ref_cnt}, held by {n} tables"
            assert (block.ref_cnt == 0) == (block.block_id in self._free), f"block {block.block_id} free-list"
            if block.block_hash is not None:
                assert self._cached.get(block.block_hash) is block, f"block {block.block_id}: hash not mapped"
        used = sum(1 for b in self.blocks if b.ref_cnt > 0)
        assert used + len(self._free) == len(self.blocks), "free + used != total"
        for h, block in self._cached.items():
            assert block.block_hash == h, f"stale mapping to block {block.block_id}"
