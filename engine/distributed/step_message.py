"""One step, as rank 0 sends it to the other ranks: a fixed-size header, then one int64 payload.

The other ranks run the same forward as rank 0, so they need exactly the runner's prepared tensors and the
block copies, nothing per request (no pickle, no Python objects). The header (80 bytes) goes down a pipe
to each rank, the payload by one broadcast (NCCL on GPUs). A rank waits for the next step in the pipe, not
in a collective: an idle engine must not trip the group timeout, and a pipe reads EOF when rank 0 dies.

    header  [HEADER_LEN] int64: version, op, T, S, W, B, C, max_query_len, max_seq_len, is_decode_only
    payload [3T + (S + 1) + S + S*W + B + 2C] int64:
            input_ids [T] | positions [T] | slot_mapping [T] | query_start_loc [S + 1] | seq_lens [S]
            | block_tables [S * W] (row-major) | sample_rows [B] | copies [2C] (src0 dst0 src1 dst1 ...)

T tokens, S sequences, W block-table width, B sampled rows, C block copies. A step with T == 0 only copies
blocks. The header of a STOP has every size 0 and no payload follows.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from multiprocessing.connection import Connection

import torch

from engine.attention.metadata import AttentionMetadata
from engine.distributed.group import TPGroup

VERSION = 1
HEADER_LEN = 10
_HEADER = struct.Struct(f"<{HEADER_LEN}q")


class Op(IntEnum):
    STEP = 1
    STOP = 2


@dataclass(frozen=True)
class StepInputs:
    """What one forward needs on any rank: rank 0 builds it from the InputBatch, the others from a message.
    meta is None (and the tensors empty) for a step that only copies blocks."""

    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata | None
    sample_rows: torch.Tensor  # [B] int64: rows of the flat batch whose logits are computed
    block_copies: list[tuple[int, int]]  # (src block, dst block), applied after the forward

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])


def pack(inputs: StepInputs) -> tuple[list[int], torch.Tensor]:
    """(header: HEADER_LEN host ints, payload [n] int64 on the inputs' device: no copy through the host)."""
    meta = inputs.meta
    device = inputs.input_ids.device
    copies = torch.tensor(inputs.block_copies, dtype=torch.int64, device=device).reshape(-1)  # [2C]
    if meta is None:
        header = [VERSION, int(Op.STEP), 0, 0, 0, 0, len(inputs.block_copies), 0, 0, 0]
        return header, copies
    num_seqs, width = meta.block_tables.shape
    header = [
        VERSION,
        Op.STEP,
        inputs.num_tokens,
        num_seqs,
        width,
        int(inputs.sample_rows.shape[0]),
        len(inputs.block_copies),
        meta.max_query_len,
        meta.max_seq_len,
        int(meta.is_decode_only),
    ]
    parts = [
        inputs.input_ids,
        inputs.positions,
        meta.slot_mapping,
        meta.query_start_loc,
        meta.seq_lens,
        meta.block_tables.reshape(-1),
        inputs.sample_rows,
    ]
    payload = torch.cat([p.to(torch.int64) for p in parts] + [copies])
    return [int(h) for h in header], payload


STOP_HEADER = [VERSION, int(Op.STOP)] + [0] * (HEADER_LEN - 2)


def payload_len(header: list[int]) -> int:
    _version, _op, t, s, w, b, c = header[:7]
    if not t:
        return 2 * c
    return 3 * t + (s + 1) + s + s * w + b + 2 * c


def unpack(header: list[int], payload: torch.Tensor) -> StepInputs:
    """The inverse of `pack`; tensors are views or casts of `payload`, on its device."""
    if header[0] != VERSION:
        raise ValueError(f"step message version {header[0]}, this rank speaks {VERSION}")
    _version, _op, t, s, w, b, c, max_query_len, max_seq_len, decode_only = header
    copies_flat = payload[payload.shape[0] - 2 * c :].tolist()
    copies = list(zip(copies_flat[0::2], copies_flat[1::2], strict=True))
    if not t:
        empty = payload[:0]
        return StepInputs(empty, empty, None, empty, copies)
    sizes = [t, t, t, s + 1, s, s * w, b]
    input_ids, positions, slots, qsl, seq_lens, tables, sample_rows = payload[: sum(sizes)].split(sizes)
    host_qsl = qsl.tolist()
    meta = AttentionMetadata(
        slot_mapping=slots,
        query_start_loc=qsl.to(torch.int32),
        seq_lens=seq_lens.to(torch.int32),
        block_tables=tables.to(torch.int32).reshape(s, w),
        max_query_len=max_query_len,
        max_seq_len=max_seq_len,
        is_decode_only=bool(decode_only),
        query_lens_cpu=tuple(hi - lo for lo, hi in zip(host_qsl, host_qsl[1:], strict=False)),
        seq_lens_cpu=tuple(seq_lens.tolist()),
    )
    return StepInputs(input_ids, positions, meta, sample_rows, copies)


def send(
    group: TPGroup, device: torch.device, pipes: Sequence[Connection], inputs: StepInputs | None
) -> None:
    """Rank 0: the step (None: STOP) to every other rank, one header pipe per rank."""
    header, payload = (STOP_HEADER, None) if inputs is None else pack(inputs)
    data = _HEADER.pack(*header)
    for pipe in pipes:
        pipe.send_bytes(data)
    if payload is not None and payload.numel():
        group.broadcast(payload.to(device))


def receive(group: TPGroup, device: torch.device, pipe: Connection) -> StepInputs | None:
    """Ranks > 0: wait for the next step from rank 0; None for STOP. Raises EOFError when rank 0 is gone."""
    header = list(_HEADER.unpack(pipe.recv_bytes()))
    if header[1] == Op.STOP:
        return None
    payload = torch.empty(payload_len(header), dtype=torch.int64, device=device)
    if payload.numel():
        group.broadcast(payload)
    return unpack(header, payload)
