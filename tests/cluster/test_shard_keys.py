"""Protocol version 2's names: documented shape, one hash slot per shard, and back from a name to its shard."""

from __future__ import annotations

import pytest
from redis.crc import key_slot

from worker.cluster.shard_keys import ShardedKeys
from worker.keys import Keys


def job_names(keys: Keys, job_id: str) -> list[str]:
    return [
        keys.requests,
        keys.dead,
        keys.attempts,
        keys.cancel_channel,
        keys.out(job_id),
        keys.cancel(job_id),
        keys.owner(job_id),
    ]


def test_names_are_the_documented_ones():
    keys = ShardedKeys("conveyor", 8).shard(3)
    assert keys.requests == "conveyor:{s3}:requests"
    assert keys.dead == "conveyor:{s3}:dead"
    assert keys.attempts == "conveyor:{s3}:attempts"
    assert keys.cancel_channel == "conveyor:{s3}:cancel"
    assert keys.out("job-1") == "conveyor:{s3}:out:job-1"
    assert keys.cancel("job-1") == "conveyor:{s3}:cancel:job-1"
    assert keys.owner("job-1") == "conveyor:{s3}:owner:job-1"


def test_every_key_of_a_shard_is_in_one_slot_and_names_round_trip():
    sharded = ShardedKeys("app", 8)
    slots = set()
    for k, keys in enumerate(sharded.all()):
        # A job id with braces of its own must not move its keys: only the first {...} is hashed.
        names = job_names(keys, "id-{x}-7")
        assert {key_slot(n.encode()) for n in names} == {key_slot(names[0].encode())}
        assert all(sharded.shard_of(n) == k for n in names)
        assert sharded.shard_of(names[4].encode()) == k
        slots.add(key_slot(names[0].encode()))
    assert len(slots) == 8  # distinct shards are distinct slots (spread over the masters' ranges)


@pytest.mark.parametrize(
    "name", ["conveyor:requests", "other:{s1}:requests", "app:{s8}:requests", "app:{s01}:out:x", "app:{x}:o"]
)
def test_names_outside_the_layout_are_refused(name):
    with pytest.raises(ValueError):
        ShardedKeys("app", 8).shard_of(name)


def test_bad_layouts_are_refused():
    with pytest.raises(ValueError):
        ShardedKeys("app", 0)
    with pytest.raises(ValueError):
        ShardedKeys("a{b}", 2)
    with pytest.raises(ValueError):
        ShardedKeys("app", 2).shard(2)
