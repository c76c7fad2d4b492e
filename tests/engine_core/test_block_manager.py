"""KV block manager: exact block ids, reference counts and eviction order."""

from __future__ import annotations

from engine.core.block_hash import hash_block_tokens
from engine.core.block_manager import KVBlockManager
from engine.core.request import Request
from tests.helpers.engine_core_utils import make_request


def compute(kv: KVBlockManager, req: Request, n: int, cached=None) -> tuple[int, ...]:
    """Allocate for n new tokens, then pretend the runner computed them."""
    alloc = kv.allocate_slots(req, n, cached) if cached is not None else kv.allocate_slots(req, n)
    assert alloc is not None
    if cached is not None:
        req.num_computed_tokens = cached.num_tokens
    req.num_computed_tokens += n
    kv.cache_full_blocks(req)
    kv.check_invariants()
    return alloc.new_block_ids


def admit(kv: KVBlockManager, req: Request) -> tuple[int, ...]:
    cached = kv.get_computed_blocks(req)
    return compute(kv, req, req.num_tokens - cached.num_tokens, cached)


def free(kv: KVBlockManager, req: Request) -> None:
    """Free, then check the pool against the tables: a free that breaks a count fails at that free."""
    kv.free(req)
    kv.check_invariants()


def refs(kv: KVBlockManager) -> list[int]:
    return [b.ref_cnt for b in kv.pool.blocks]


def test_allocate_append_across_boundary_and_free_tail_first():
    kv = KVBlockManager(num_blocks=8, block_size=4)
    req = make_request("a", list(range(10)))
    assert compute(kv, req, 10) == (0, 1, 2)
    assert kv.block_ids("a") == (0, 1, 2)
    assert (kv.num_used_blocks, kv.num_free_blocks) == (3, 5)
    req.append_output_token(50)  # token 11 fits block 2
    assert compute(kv, req, 1) == ()
    req.append_output_token(51)  # token 12 fills block 2
    assert compute(kv, req, 1) == ()
    req.append_output_token(52)  # token 13 needs a new block
    assert compute(kv, req, 1) == (3,)
    assert refs(kv)[:5] == [1, 1, 1, 1, 0]
    free(kv, req)
    assert kv.num_used_blocks == 0
    # Never-used blocks first, then this request's blocks tail first.
    assert kv.pool.free_order() == [4, 5, 6, 7, 3, 2, 1, 0]
    kv.check_invariants()


def test_does_not_fit_returns_none_and_changes_nothing():
    kv = KVBlockManager(num_blocks=2, block_size=4)
    req = make_request("a", list(range(9)))
    assert kv.allocate_slots(req, 9) is None
    assert kv.block_ids("a") == () and kv.num_free_blocks == 2
    kv.check_invariants()


def test_prefix_hit_shares_blocks_and_counts_tokens():
    kv = KVBlockManager(num_blocks=8, block_size=4)
    a = make_request("a", list(range(10)))
    admit(kv, a)
    free(kv, a)  # free order: 3..7, 2, 1, 0
    b = make_request("b", list(range(8)) + [90, 91, 92])
    cached = kv.get_computed_blocks(b)
    assert [blk.block_id for blk in cached.blocks] == [0, 1] and cached.num_tokens == 8
    assert compute(kv, b, 3, cached) == (3,)
    assert kv.block_ids("b") == (0, 1, 3)
    c = make_request("c", list(range(8)) + [70])  # hits blocks that are in use: shared by reference
    assert admit(kv, c) == (4,)
    assert refs(kv)[:5] == [2, 2, 0, 1, 1]
    assert (kv.prefix_cache_queries, kv.prefix_cache_hits) == (10 + 11 + 9, 0 + 8 + 8)
    free(kv, b)
    free(kv, c)
    assert all(r == 0 for r in refs(kv))
    kv.check_invariants()


def test_prefix_miss_on_different_first_block():
    kv = KVBlockManager(num_blocks=8, block_size=4)
    admit(kv, make_request("a", list(range(10))))
    b = make_request("b", [99] + list(range(1, 10)))
    assert kv.get_computed_blocks(b).num_tokens == 0


def test_hash_collision_compares_token_ids():
    kv = KVBlockManager(num_blocks=8, block_size=4, hash_fn=lambda parent, ids: b"same")
    a = make_request("a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    admit(kv, a)
    # Only block 0 got the colliding hash; block 1 could not be registered under it.
    assert kv.pool.blocks[0].block_hash == b"same" and kv.pool.blocks[1].block_hash is None
    b = make_request("b", [9, 9, 9, 9, 5, 6, 7, 8, 9])
    assert kv.get_computed_blocks(b).num_tokens == 0
    c = make_request("c", [1, 2, 3, 4, 0, 0, 0, 0, 9])
    assert [blk.block_id for blk in kv.get_computed_blocks(c).blocks] == [0]


def test_evicted_block_drops_stale_hash_mapping():
    kv = KVBlockManager(num_blocks=2, block_size=4)
    a = make_request("a", [1, 2, 3, 4, 5])
    admit(kv, a)
    h0 = kv.pool.blocks[0].block_hash
    assert h0 == hash_block_tokens(None, [1, 2, 3, 4])
    free(kv, a)
    assert kv.pool.free_order() == [1, 0]
    b = make_request("b", [8, 8, 8, 8, 8, 8, 8, 8])
    assert admit(kv, b) == (1, 0)  # block 0 reused for other content
    kv.check_invariants()
    assert kv.pool.blocks[0].block_hash != h0
    free(kv, b)
    a2 = make_request("a2", [1, 2, 3, 4, 5])
    assert kv.get_computed_blocks(a2).num_tokens == 0  # no hit on block 0's new content


def test_lru_evicts_least_recently_freed_cached_block_first():
    kv = KVBlockManager(num_blocks=4, block_size=2)
    a = make_request("a", [1, 2, 3])
    b = make_request("b", [5, 6, 7])
    admit(kv, a)  # blocks 0, 1
    admit(kv, b)  # blocks 2, 3
    free(kv, a)
    free(kv, b)
    assert kv.pool.free_order() == [1, 0, 3, 2]
    c = make_request("c", [9, 9, 9])
    assert admit(kv, c) == (1, 0)  # a's blocks go first: a's cached prefix evicted, b's survives
    assert kv.get_computed_blocks(make_request("b2", [5, 6, 7])).num_tokens == 2
    assert kv.get_computed_blocks(make_request("a3", [1, 2, 3])).num_tokens == 0


def test_full_prompt_hit_recomputes_last_block():
    kv = KVBlockManager(num_blocks=8, block_size=4)
    admit(kv, make_request("a", list(range(8))))
    same = make_request("b", list(range(8)))
    cached = kv.get_computed_blocks(same)
    assert cached.num_tokens == 4  # never all 8: the last token must be computed to get logits
    assert compute(kv, same, 4, cached) == (2,)
    longer = make_request("c", list(range(9)))
    assert kv.get_computed_blocks(longer).num_tokens == 8


def test_fork_shares_full_blocks_and_copies_partial_block():
    kv = KVBlockManager(num_blocks=8, block_size=4)
    parent = make_request("p", list(range(10)))
    child = make_request("c", list(range(10)))
    assert compute(kv, parent, 10) == (0, 1, 2)
    fork = kv.fork(parent, child)
    assert fork is not None and fork.block_copies == ((2, 3),)
    assert kv.block_ids("c") == (0, 1, 3)
    assert refs(kv)[:4] == [2, 2, 1, 1]
    kv.check_invariants()
    free(kv, parent)
    assert refs(kv)[:4] == [1, 1, 0, 1]
    free(kv, child)
    assert kv.num_used_blocks == 0


def test_fork_on_block_boundary_shares_everything():
    kv = KVBlockManager(num_blocks=4, block_size=4)
    parent = make_request("p", list(range(8)))
    compute(kv, parent, 8)
    fork = kv.fork(parent, make_request("c", list(range(8))))
    assert fork is not None and fork.block_copies == ()
    assert kv.block_ids("c") == (0, 1) and refs(kv) == [2, 2, 0, 0]


def test_fork_without_free_block_returns_none():
    kv = KVBlockManager(num_blocks=3, block_size=4)
    parent = make_request("p", list(range(10)))
    compute(kv, parent, 10)
    assert kv.fork(parent, make_request("c", list(range(10)))) is None
    assert refs(kv) == [1, 1, 1] and kv.block_ids("c") == ()
    kv.check_invariants()


def test_prefix_caching_disabled_never_hits():
    kv = KVBlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    admit(kv, make_request("a", list(range(10))))
    assert kv.get_computed_blocks(make_request("b", list(range(10)))).num_tokens == 0
    assert kv.pool.num_cached == 0
