"""Per-request block tables over one BlockPool, with prefix caching and copy-on-write forks.

block_size = 4, prompt = 10 tokens
tokens   [t0 t1 t2 t3][t4 t5 t6 t7][t8 t9 .  .]
table    [    7      ][     2     ][    9     ]     full blocks 7, 2 are hashed: h7 = H(None, t0..t3),
                                                  h2 = H(h7, t4..t7); block 9 is partial, never hashed.

A table is an immutable tuple, replaced by a new one only when blocks are appended (one decode step in
block_size); the scheduler sends the runner only the blocks appended since the last step (a slice of it).

`reserve_tokens` set (the engine's kv_allocation "reserve_max"): a request's table is sized for that many
tokens when it is admitted (or forked), as systems that give each request one contiguous region of its
maximum length do, so it never allocates again; a request whose reservation does not fit waits.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_hash import BlockHash, HashFn, hash_block_tokens
from engine.core.block_pool import BlockPool, KVBlock
from engine.core.request import Request


@dataclass(frozen=True)
class CachedPrefix:
    """Blocks found in the prefix cache for a request's leading tokens."""

    blocks: tuple[KVBlock, ...]
    num_tokens: int


NO_PREFIX = CachedPrefix((), 0)


@dataclass(frozen=True)
class Allocation:
    new_block_ids: tuple[int, ...]


@dataclass(frozen=True)
class Fork:
    # (src, dst) copies of the parent's partly filled last block; empty when the prompt fills whole blocks.
    block_copies: tuple[tuple[int, int], ...]


class KVBlockManager:
    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_prefix_caching: bool = True,
        hash_fn: HashFn = hash_block_tokens,
        reserve_tokens: int | None = None,
    ) -> None:
        self.block_size = block_size
        # None: blocks on demand (paged). Else every table holds at least this many tokens from admission.
        self.reserve_tokens = reserve_tokens
        self.enable_prefix_caching = enable_prefix_caching
        self.pool = BlockPool(num_blocks)
        self._hash_fn = hash_fn
        # request id -> its block table (a new tuple whenever blocks are appended). The dict itself is never
        # replaced: the scheduler keeps a reference to it.
        self.tables: dict[str, tuple[int, ...]] = {}
        # Chain hashes of the request's full blocks, computed once per block (kept while it has a table
        # or sits at the head of the waiting queue).
        self._hashes: dict[str, list[BlockHash]] = {}
        # How many leading blocks of the table are already registered in the prefix cache.
        self._num_registered: dict[str, int] = {}
        # Full blocks an admitted request computes itself (from its cached prefix up to this index); the
        # hashes of those not registered yet are `_computing`, with how many requests compute each.
        self._compute_end: dict[str, int] = {}
        self._computing: dict[BlockHash, int] = {}
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0

    # ------------------------------------------------------------------ queries

    @property
    def num_blocks(self) -> int:
        return self.pool.num_blocks

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free

    def block_ids(self, request_id: str) -> tuple[int, ...]:
        """The request's table; empty when it holds no blocks."""
        return self.tables.get(request_id, ())

    def table_owners(self) -> set[str]:
        return set(self.tables)

    def blocks_needed(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def blocks_at_admission(self, num_tokens: int) -> int:
        """Blocks a table of `num_tokens` tokens takes when admitted: the reservation, when larger."""
        return self.blocks_needed(max(num_tokens, self.reserve_tokens or 0))

    def has_room(self, request_id: str, num_tokens: int) -> bool:
        """Whether the request's table already holds `num_tokens` tokens (then allocate_slots would take
        nothing): most decode steps, answered without building an Allocation."""
        table = self.tables.get(request_id)
        return table is not None and len(table) * self.block_size >= num_tokens

    # ------------------------------------------------------------------ verbs

    def get_computed_blocks(self, request: Request) -> CachedPrefix:
        """Longest cached prefix of the request's tokens, in full blocks, leaving at least the last token
        to compute so the step has logits to sample from (a full-prompt hit recomputes its last block).
        A request asking for prompt logprobs reads none (a cached prefix has no logits), as in vLLM."""
        if not self.enable_prefix_caching:
            return NO_PREFIX
        max_blocks = (request.num_tokens - 1) // self.block_size
        hashes = self._ensure_hashes(request, max_blocks)
        if request.params.prompt_logprobs is not None:
            return NO_PREFIX
        tokens = request.token_ids()
        bs = self.block_size
        hits: list[KVBlock] = []
        for i in range(max_blocks):
            block = self.pool.lookup(hashes[i], tokens[i * bs : (i + 1) * bs])
            if block is None:
                break
            hits.append(block)
        return CachedPrefix(tuple(hits), len(hits) * bs)

    def num_tokens_computing(self, request: Request, cached: CachedPrefix) -> int:
        """Tokens of the request's full blocks right after its cached prefix that admitted requests are
        computing now: were it admitted once they are registered, it would find them cached instead of
        computing them again. Call after get_computed_blocks."""
        if not self._computing or request.params.prompt_logprobs is not None:  # it reads no cache
            return 0
        hashes = self._hashes.get(request.request_id, ())
        i = n = len(cached.blocks)
        while n < len(hashes) and hashes[n] in self._computing:
            n += 1
        return (n - i) * self.block_size

    def allocate_slots(
        self, request: Request, num_new_tokens: int, cached: CachedPrefix = NO_PREFIX
    ) -> Allocation | None:
        """Grow the table to hold num_computed_tokens + num_new_tokens tokens (after the cached prefix on
        admission). None when the free blocks do not suffice; then nothing changed."""
        rid = request.request_id
        table = self.tables.get(rid)
        admitted = table is None
        if table is None:
            table = ()
            num_computed = cached.num_tokens
        else:
            assert not cached.blocks, "a cached prefix is only taken on admission"
            num_computed = request.num_computed_tokens
        wanted = num_computed + num_new_tokens
        num_wanted = self.blocks_at_admission(wanted) if admitted else self.blocks_needed(wanted)
        num_new_blocks = num_wanted - len(table) - len(cached.blocks)
        # Cached hits with ref_cnt 0 sit in the free list, so taking them uses free blocks too.
        num_revived = sum(1 for b in cached.blocks if b.ref_cnt == 0)
        if max(num_new_blocks, 0) + num_revived > self.pool.num_free:
            return None
        if admitted:
            self._num_registered[rid] = len(cached.blocks)
            self.prefix_cache_queries += request.num_tokens
            self.prefix_cache_hits += cached.num_tokens
            if self.enable_prefix_caching:
                self._will_compute(request, len(cached.blocks))
        # Touch hits before taking new blocks, else the LRU eviction could hand out a hit block.
        for block in cached.blocks:
            self.pool.touch(block)
        new_ids = []
        for _ in range(num_new_blocks):
            fresh = self.pool.take()
            assert fresh is not None
            new_ids.append(fresh.block_id)
        if admitted or new_ids:  # a new object only when the content changes
            self.tables[rid] = table + tuple(b.block_id for b in cached.blocks) + tuple(new_ids)
        return Allocation(tuple(new_ids))

    def cache_full_blocks(self, request: Request) -> None:
        """Register blocks that became full of computed tokens since the last call (each hashed once)."""
        if not self.enable_prefix_caching:
            return
        rid = request.request_id
        table = self.tables.get(rid)
        if table is None:
            return
        start = self._num_registered[rid]
        end = min(request.num_computed_tokens, request.num_tokens) // self.block_size
        if end <= start:
            return
        hashes = self._ensure_hashes(request, end)
        tokens = request.token_ids()
        bs = self.block_size
        for i in range(start, end):
            block = self.pool.blocks[table[i]]
            if block.block_hash is None:
                self.pool.cache(block, hashes[i], tokens[i * bs : (i + 1) * bs])
        self._computed(hashes, start, min(end, self._compute_end.get(rid, 0)))
        self._num_registered[rid] = end

    def fork(self, parent: Request, child: Request) -> Fork | None:
        """Give `child` the parent's prompt blocks: full blocks shared by reference, a partly filled last
        block copied into a fresh one (the runner copies after this step's forward), and fresh blocks up
        to the reservation, if any. None: not enough free blocks (then nothing changed)."""
        table = self.tables[parent.request_id]
        num_prompt = parent.num_prompt_tokens
        num_full = num_prompt // self.block_size
        partial = num_prompt % self.block_size != 0
        num_reserved = max(0, self.blocks_at_admission(num_prompt) - num_full - partial)
        if partial + num_reserved > self.pool.num_free:
            return None
        copies: tuple[tuple[int, int], ...] = ()
        child_table = table[:num_full]
        if partial:
            block = self.pool.take()
            assert block is not None
            copies = ((table[num_full], block.block_id),)
        for block_id in child_table:
            self.pool.touch(self.pool.blocks[block_id])
        if partial:
            child_table += (copies[0][1],)
        for _ in range(num_reserved):
            fresh = self.pool.take()
            assert fresh is not None
            child_table += (fresh.block_id,)
        self.tables[child.request_id] = child_table
        self._num_registered[child.request_id] = 0
        if parent.request_id in self._hashes:
            self._hashes[child.request_id] = self._hashes[parent.request_id][:num_full]
        return Fork(copies)

    def free(self, request: Request) -> None:
        """Return every block of the request, tail first, so tails are evicted before shared prefixes."""
        rid = request.request_id
        hashes = self._hashes.pop(rid, [])
        self._computed(hashes, self._num_registered.pop(rid, 0), self._compute_end.pop(rid, 0))
        table = self.tables.pop(rid, None)
        if table is None:
            return
        blocks = self.pool.blocks
        for block_id in reversed(table):
            self.pool.release(blocks[block_id])

    def check_invariants(self) -> None:
        holders: dict[int, int] = {}
        for table in self.tables.values():
            for block_id in table:
                holders[block_id] = holders.get(block_id, 0) + 1
        self.pool.check_invariants(holders)
        if self.reserve_tokens is not None:
            reserved = self.blocks_needed(self.reserve_tokens)
            for rid, table in self.tables.items():
                assert len(table) >= reserved, (
                    f"{rid}: {len(table)} blocks, below its reservation of {reserved}"
                )
        computing: dict[BlockHash, int] = {}
        for rid, end in self._compute_end.items():
            for h in self._hashes[rid][self._num_registered[rid] : end]:
                computing[h] = computing.get(h, 0) + 1
        assert computing == self._computing, "blocks counted as being computed disagree with the tables"

    # ------------------------------------------------------------------ helpers

    def _will_compute(self, request: Request, first: int) -> None:
        """An admitted request computes its full blocks from index `first` (after its cached prefix)."""
        end = request.num_tokens // self.block_size
        hashes = self._ensure_hashes(request, end)
        self._compute_end[request.request_id] = end
        for h in hashes[first:end]:
            self._computing[h] = self._computing.get(h, 0) + 1

    def _computed(self, hashes: list[BlockHash], start: int, end: int) -> None:
        """Blocks start..end-1 of a request are registered now, or will never be (it was freed)."""
        for h in hashes[start:end]:
            left = self._computing[h] - 1
            if left:
                self._computing[h] = left
            else:
                del self._computing[h]

    def _ensure_hashes(self, request: Request, num_blocks: int) -> list[BlockHash]:
        hashes = self._hashes.setdefault(request.request_id, [])
        if len(hashes) < num_blocks:
            tokens = request.token_ids()
            bs = self.block_size
            parent = hashes[-1] if hashes else None
            for i in range(len(hashes), num_blocks):
                parent = self._hash_fn(parent, tokens[i * bs : (i + 1) * bs])
                hashes.append(parent)
        return hashes
