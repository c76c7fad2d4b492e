"""benchmarks/redis_scale.py --quick: the stub engine's events through one Redis and a 3-master cluster."""

from __future__ import annotations

import json

import pytest

pytestmark = [pytest.mark.redis]


def test_quick_pairs_one_redis_with_a_cluster(run_benchmark, redis_installed, tmp_path):
    out = tmp_path / "r.json"
    run_benchmark("redis_scale.py", "--quick", "--out", str(out))
    (pairing,) = json.loads(out.read_text())["pairings"]
    assert pairing["replicas_per_master"] == 0
    assert pairing["single"]["events"] == pairing["cluster"]["events"] > 0
    assert pairing["cluster"]["masters"] == 3
