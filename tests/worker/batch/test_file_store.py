"""The HTTP API's file and batch stores on a real redis-server: OpenAI's shapes, size cap, tenants kept apart."""

from __future__ import annotations

import pytest
from openai.types import Batch, FileObject

from worker.batch.batch_store import BadWindow, BatchStore, window_seconds
from worker.batch.file_store import FileStore, FileTooLarge
from worker.keys import Keys

pytestmark = pytest.mark.redis
K = Keys()


def test_files_round_trip_cap_and_tenants(r):
    files = FileStore(r, K, max_bytes=100)
    a = files.create("alice", "in.jsonl", "batch", b'{"x": 1}\n')
    FileObject.model_validate(a.model_dump())  # the SDK's type parses what the API returns
    assert (a.object, a.bytes, a.filename, a.purpose) == ("file", 9, "in.jsonl", "batch")
    assert files.get("alice", a.id) == a and files.content("alice", a.id) == b'{"x": 1}\n'
    # Another tenant sees nothing of it: not by id, not its content, not in its listing, cannot delete it.
    assert files.get("bob", a.id) is None and files.content("bob", a.id) is None
    assert files.page("bob") == [] and not files.delete("bob", a.id)
    with pytest.raises(FileTooLarge):
        files.create("alice", "big.jsonl", "batch", b"x" * 101)
    b = files.create("alice", "b.jsonl", "batch", b"{}\n")
    out = files.create("alice", "o.jsonl", "batch_output", b"y" * 500, file_id="file-o")  # outputs: no cap
    listed = [f.id for f in files.page("alice", order="asc")]
    assert set(listed) == {a.id, b.id, out.id}
    assert [f.id for f in files.page("alice", purpose="batch_output")] == ["file-o"]
    assert len(files.page("alice", limit=2)) == 2
    assert files.delete("alice", a.id) and files.get("alice", a.id) is None
    assert a.id not in [f.id for f in files.page("alice")]


def test_batches_shape_tenants_and_cancel(r):
    batches = BatchStore(r, K)
    b = batches.create("alice", "file-1", "/v1/chat/completions", "24h", {"k": "v"})
    assert b.expires_at - b.created_at == 24 * 3600
    got = batches.get("alice", b.id)
    assert got is not None and Batch.model_validate(got.model_dump()).status == "validating"
    assert got.metadata == {"k": "v"} and got.request_counts.total == 0
    assert (
        batches.get("bob", b.id) is None and batches.page("bob") == [] and batches.cancel("bob", b.id) is None
    )
    assert batches.open_ids() == [b.id]
    cancelled = batches.cancel("alice", b.id)
    assert cancelled is not None and cancelled.status == "cancelling" and cancelled.cancelling_at is not None
    # A final batch is not moved by a cancel.
    batches.move(b.id, {"cancelling"}, {"status": "cancelled", "cancelled_at": 1})
    assert batches.cancel("alice", b.id).status == "cancelled"  # type: ignore[union-attr]
    newer = batches.create("alice", "file-2", "/v1/completions", "1h")
    assert [x.id for x in batches.page("alice")] == [newer.id, b.id]
    assert [x.id for x in batches.page("alice", after=newer.id)] == [b.id]


def test_completion_window():
    assert window_seconds("24h") == 86400 and window_seconds("90s") == 90 and window_seconds("2m") == 120
    for bad in ("24", "0h", "1d", "h", "-1h"):
        with pytest.raises(BadWindow):
            window_seconds(bad)
