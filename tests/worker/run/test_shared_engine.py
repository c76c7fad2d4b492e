"""One engine behind the shards' workers: each view gets its own jobs' deltas, once; capacity read by one
shard and not yet started is not offered to the others; an id runs once across shards."""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.helpers.worker_fakes import FakeEngine
from worker.run.shared_engine import SharedEngine


def test_each_view_gets_its_own_deltas_once_per_cycle():
    shared = SharedEngine(FakeEngine(step_s=0), 3)
    a, b, c = shared.views
    a.add_request("x", "p", SamplingParams(max_tokens=2))
    b.add_request("y", "q", SamplingParams(max_tokens=2, n=2))
    assert c.has_unfinished_requests()  # the engine has work: every shard does its round
    shared.new_cycle()
    assert {d.request_id for d in b.step()} == {"y"}  # the first to step steps the engine
    assert [d.request_id for d in a.step()] == ["x"]
    assert c.step() == [] and a.step() == []  # one engine step per cycle, each delta handed out once
    shared.new_cycle()
    assert all(d.finished for d in c.step() + a.step() + b.step()) is True
    assert shared.shard_of == {} and not a.has_unfinished_requests()  # forgotten once all samples ended


def test_a_late_view_still_gets_its_deltas_when_the_engine_went_idle():
    shared = SharedEngine(FakeEngine(step_s=0), 2)
    a, b = shared.views
    b.add_request("y", "q", SamplingParams(max_tokens=1))
    shared.new_cycle()
    assert a.step() == []  # steps the engine: y's only (and final) delta waits for b
    assert not shared.engine.has_unfinished_requests() and b.has_unfinished_requests()
    assert [d.finished for d in b.step()] == [True]


def test_capacity_reserved_by_other_shards_is_not_offered():
    shared = SharedEngine(FakeEngine(max_num_seqs=4, step_s=0), 3)
    reserved = {0: 1, 1: 2, 2: 0}
    shared.reserved = reserved.__getitem__
    assert shared.views[2].free_capacity()[0] == 1
    assert shared.views[0].free_capacity()[0] == 2
    reserved[1] = 9
    assert shared.views[2].free_capacity()[0] == 0


def test_the_same_id_from_two_shards_is_refused():
    shared = SharedEngine(FakeEngine(step_s=0), 2)
    shared.views[0].add_request("x", "p", SamplingParams(max_tokens=2))
    with pytest.raises(ValueError, match="already running"):
        shared.views[1].add_request("x", "p", SamplingParams(max_tokens=2))
    assert shared.shard_of == {"x": 0}
