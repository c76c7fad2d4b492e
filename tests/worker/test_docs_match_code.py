"""The docs state what the code does (issue 20, item 7): the limits on stop strings, stop token ids and n
are read from SamplingParams; without priority lanes `priority` orders only the jobs a worker has taken,
never the backlog in Redis, which the worker reads in entry order (shown with a worker that has room for
one job at a time; with priority lanes: tests/worker/run/test_build.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import structlog

from engine.sampling_params import SamplingParams
from tests.helpers.worker_fakes import FakeEngine, running_worker
from worker.client import collect, enqueue
from worker.connection import connect

ROOT = Path(__file__).resolve().parents[2]


def _doc(name: str) -> str:
    return " ".join((ROOT / "docs" / name).read_text().split())  # line breaks as spaces


def _bound(field: str, name: str) -> int:
    """The pydantic constraint `name` (max_length, le...) of a SamplingParams field."""
    return next(getattr(m, name) for m in SamplingParams.model_fields[field].metadata if hasattr(m, name))


def test_the_threat_model_states_the_stop_string_limits_of_the_code():
    text = _doc("threat-model.md")
    assert f"at most {_bound('stop', 'max_length')} stop strings" in text
    assert f"{_bound('stop_token_ids', 'max_length')} `stop_token_ids`" in text
    assert f"engine's maximum ({_bound('n', 'le')})" in text
    assert "do not bound the number of stop strings" not in text


def test_the_protocol_says_priority_does_not_reorder_the_backlog():
    row = next(
        line for line in (ROOT / "docs" / "protocol.md").read_text().splitlines() if "| `priority`" in line
    )
    assert "orders only the jobs a worker has already taken" in row
    assert "does not reorder the backlog in Redis" in row
    assert "Across the backlog in Redis only with priority lanes" in row


@pytest.mark.redis
@pytest.mark.timeout(60)
def test_the_backlog_is_read_in_entry_order_whatever_the_priority(redis_server):
    client = connect(redis_server.url)
    client.flushall()
    jobs = [("low", 10), ("mid", 0), ("high", -10)]  # enqueued in this order, priority rising
    for job_id, priority in jobs:
        enqueue(client, {"id": job_id, "prompt": job_id, "max_tokens": 3, "priority": priority})
    with (
        structlog.testing.capture_logs() as logs,
        running_worker(FakeEngine(max_num_seqs=1), redis_server.url),
    ):
        for job_id, _ in jobs:
            assert collect(client, job_id, timeout_s=10)[-1]["type"] == "done"
    admitted = [e["request_id"] for e in logs if e["event"] == "job admitted"]
    assert admitted == ["low", "mid", "high"]
