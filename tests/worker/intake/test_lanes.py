"""Lane layouts (intake/lanes.py): today's single stream and cluster shards, and split streams."""

from __future__ import annotations

import pytest

from worker.intake.lanes import cluster_shards, single_stream, split_stream
from worker.keys import Keys


def test_the_single_stream_is_protocol_version_1():
    (lane,) = single_stream(Keys(), "g")
    assert lane.stream == "conveyor:requests" and lane.group == "g" and lane.keys.out("j") == "conveyor:out:j"


def test_cluster_shards_are_protocol_version_2():
    lanes = cluster_shards("conveyor", 3, "g")
    assert [lane.stream for lane in lanes] == [f"conveyor:{{s{k}}}:requests" for k in range(3)]
    assert lanes[2].keys.out("j") == "conveyor:{s2}:out:j"  # a job's keys in its shard's slot


def test_split_streams_share_the_jobs_keys():
    lanes = split_stream(Keys(), "g", ["p0", "p1"])
    assert [lane.stream for lane in lanes] == ["conveyor:requests:p0", "conveyor:requests:p1"]
    assert {lane.keys.out("j") for lane in lanes} == {"conveyor:out:j"}  # one id, one job
    with pytest.raises(ValueError):
        split_stream(Keys(), "g", ["a", "a"])
