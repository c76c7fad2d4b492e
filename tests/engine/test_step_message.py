"""The tensor-parallel step message: pack -> unpack gives back every tensor and host int, without processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from engine.distributed import step_message
from engine.distributed.group import TPGroup
from engine.distributed.step_message import STOP_HEADER, StepInputs, pack, receive, send, unpack
from engine.input_batch import InputBatch
from tests.helpers.model_helpers import TableLayout, prepare_with_tables


def _step(copies: list[tuple[int, int]]) -> StepInputs:
    batch = InputBatch(block_size=4, device=torch.device("cpu"), max_tokens=16, max_seqs=4, max_blocks=4)
    seqs = [
        TableLayout("a", [5, 6, 7, 8, 9], start_pos=2, block_ids=[3, 1], sample=True),  # prefill chunk
        TableLayout("b", [11], start_pos=9, block_ids=[0, 2, 4], sample=True),  # decode
        TableLayout("c", [12, 13], start_pos=0, block_ids=[5], sample=False),  # mid-prompt chunk
        TableLayout("a2", [], start_pos=7, block_ids=[3, 6], sample=True, fork_of="a"),
    ]
    s = prepare_with_tables(batch, seqs)
    return StepInputs(s.input_ids, s.positions, s.meta, s.sample_rows, copies)


def _assert_same(got: StepInputs, want: StepInputs) -> None:
    for name in ("input_ids", "positions", "sample_rows"):
        assert torch.equal(getattr(got, name), getattr(want, name)), name
    assert got.block_copies == want.block_copies
    assert got.meta is not None and want.meta is not None
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        a, b = getattr(got.meta, name), getattr(want.meta, name)
        assert a.dtype == b.dtype and torch.equal(a, b), name
    for name in ("max_query_len", "max_seq_len", "is_decode_only", "query_lens_cpu", "seq_lens_cpu"):
        assert getattr(got.meta, name) == getattr(want.meta, name), name


def test_a_mixed_step_round_trips():
    want = _step(copies=[(3, 6), (1, 7)])
    header, payload = pack(want)
    assert len(header) == step_message.HEADER_LEN and payload.dtype == torch.int64
    _assert_same(unpack(header, payload), want)


def test_a_decode_only_step_without_copies_round_trips():
    batch = InputBatch(block_size=4, device=torch.device("cpu"), max_tokens=8, max_seqs=4, max_blocks=4)
    s = prepare_with_tables(batch, [TableLayout("x", [3], start_pos=4, block_ids=[2, 9], sample=True)])
    want = StepInputs(s.input_ids, s.positions, s.meta, s.sample_rows, [])
    got = unpack(*pack(want))
    _assert_same(got, want)
    assert got.meta is not None and got.meta.is_decode_only


def test_a_copies_only_step_carries_no_tensors():
    empty = torch.zeros(0, dtype=torch.int64)
    header, payload = pack(StepInputs(empty, empty, None, empty, [(1, 2), (4, 8)]))
    assert payload.tolist() == [1, 2, 4, 8]
    got = unpack(header, payload)
    assert got.meta is None and got.num_tokens == 0 and got.block_copies == [(1, 2), (4, 8)]


def test_another_version_is_refused():
    header, payload = pack(_step(copies=[]))
    header[0] += 1
    with pytest.raises(ValueError, match="version"):
        unpack(header, payload)


def test_headers_travel_down_the_pipe_and_stop_ends_the_stream():
    """One rank (no broadcast needed): what send writes, receive reads back; then STOP reads as None."""
    reader, writer = mp.Pipe(duplex=False)
    want = _step(copies=[(0, 1)])
    group, cpu = TPGroup.single(), torch.device("cpu")
    send(group, cpu, [writer], want)
    send(group, cpu, [writer], None)
    # With one rank the payload is not broadcast: hand receive's broadcast the packed payload instead.
    payload = pack(want)[1]
    group_with_payload = _FixedPayload(payload)
    got = receive(group_with_payload, cpu, reader)  # type: ignore[arg-type]
    assert got is not None
    _assert_same(got, want)
    assert receive(group, cpu, reader) is None
    assert STOP_HEADER[1] == step_message.Op.STOP


class _FixedPayload:
    """A stand-in group whose broadcast fills the tensor with rank 0's payload."""

    def __init__(self, payload: torch.Tensor) -> None:
        self.payload = payload

    def broadcast(self, x: torch.Tensor) -> torch.Tensor:
        return x.copy_(self.payload)
