"""Home shards by rendezvous hashing (worker/fleet/home_shards.py): one owner per shard, and only the
joining or leaving worker's share moves."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker.fleet.home_shards import home_shards

names = st.lists(st.text("abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=12), unique=True)


def owners(owned: dict[str, set[int]]) -> dict[int, str]:
    return {shard: name for name, mine in owned.items() for shard in mine}


def test_the_docstring_example():
    assert home_shards(6, ["w0", "w1"]) == {"w0": {1, 2, 4}, "w1": {0, 3, 5}}
    assert home_shards(6, ["w1", "w2", "w0"]) == {"w0": {1, 2, 4}, "w1": {0, 5}, "w2": {3}}


def test_no_live_worker_owns_nothing_and_more_workers_than_shards_leave_some_without():
    assert home_shards(4, []) == {}
    owned = home_shards(2, [f"w{i}" for i in range(6)])
    assert sorted(s for mine in owned.values() for s in mine) == [0, 1]
    assert sum(1 for mine in owned.values() if not mine) >= 4


@given(st.integers(1, 40), names.filter(bool))
def test_every_shard_has_exactly_one_owner_whatever_the_order(shards, consumers):
    owned = home_shards(shards, consumers)
    assert set(owned) == set(consumers)
    assert sorted(s for mine in owned.values() for s in mine) == list(range(shards))
    assert home_shards(shards, list(reversed(consumers))) == owned


@given(st.integers(1, 40), names.filter(bool), st.text("xyz", min_size=13, max_size=14))
def test_a_joining_worker_takes_over_only_its_own_share(shards, consumers, newcomer):
    before = owners(home_shards(shards, consumers))
    after = owners(home_shards(shards, [*consumers, newcomer]))
    moved = {k for k in range(shards) if before[k] != after[k]}
    assert all(after[k] == newcomer for k in moved)
    assert moved == {k for k in range(shards) if after[k] == newcomer}


@given(st.integers(1, 40), names.filter(lambda n: len(n) >= 2), st.data())
def test_a_leaving_workers_shards_go_to_the_others_and_nothing_else_moves(shards, consumers, data):
    leaver = data.draw(st.sampled_from(consumers))
    before = owners(home_shards(shards, consumers))
    after = owners(home_shards(shards, [c for c in consumers if c != leaver]))
    for k in range(shards):
        if before[k] != leaver:
            assert after[k] == before[k]
        else:
            assert after[k] != leaver


def test_a_leaving_workers_shards_spread_over_the_others_and_shares_are_even():
    consumers = [f"worker-{i}" for i in range(4)]
    before = home_shards(64, consumers)
    assert all(10 <= len(mine) <= 22 for mine in before.values())  # about 16 each
    after = owners(home_shards(64, consumers[1:]))
    receivers = {after[k] for k in before["worker-0"]}
    assert len(receivers) == 3  # not all to one neighbour, as on a hash ring without virtual nodes
