"""The host-side layout of one step, built vectorised, into persistent buffers of fixed addresses.

Per step the runner needs flat input ids and positions [T], the slot of every new token [T], and per
sequence its query start [S + 1], context length [S] and block table [S, W]. Built per token in Python
this cost ~7 ms at 256 sequences x 1k tokens; here the sequences' fields are read as columns in C
(attrgetter + zip), one comprehension finds each sequence's table row, and the per-token work is numpy
(a decode-only step, one token per sequence, skips the per-token index arithmetic altogether):

    seq:        A (chunk of 3 from pos 5)   B (decode at pos 9)
    qlens:      3                           1
    seq_of:     0 0 0                       1              np.repeat(arange(S), qlens)
    positions:  5 6 7                       9              arange(T) - qsl[seq_of] + start[seq_of]
    slots:      table[row[seq_of], pos // bs] * bs + pos % bs

Block tables are kept between steps in the persistent batch (`engine.batch_rows`): each request owns a row,
written by the runner from the scheduler's diffs (the blocks appended since the last step); a step
gathers its rows. The results are written into the
host mirrors of device buffers allocated once (on the CPU, the buffers themselves), so the tensors of a
step of S sequences and T tokens are always views at the same addresses, which CUDA graph replay needs. Padding (`pad_to`) appends decode-like
sequences with slot -1 (their K/V are not written), position 0, context length 1 and an all-zero block
table row, so a padded batch computes the same rows for every real sequence.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import chain, compress
from operator import attrgetter

import numpy as np
import torch

from engine.attention.metadata import AttentionMetadata
from engine.batch_rows import BatchRows


class DeviceBuffers:
    """Step tensors allocated once at their maximum sizes; a step's tensors are views of their prefixes.

    Sizes grow (new addresses) when a step needs more, unless `frozen` (CUDA graphs captured), then it raises.
    Each buffer has a host-side numpy mirror (`host[name]`) that prepare() writes into; `upload` then gives
    the device view. On the CPU the mirror is the buffer itself (a numpy view of the same memory): no copy.
    Elsewhere it is pinned host memory, copied over by `upload` without waiting for the device (a blocking
    copy would wait for every step queued before it, which async scheduling must not); before the mirrors
    are written again, `host_free()` waits for the last step's copies only (an event after them).
    """

    NAMES = (
        "input_ids",
        "positions",
        "slot_mapping",
        "query_start_loc",
        "seq_lens",
        "block_tables",
        "sample_rows",
    )

    def __init__(self, device: torch.device, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        self.device = device
        self.frozen = False
        self._uploaded: torch.cuda.Event | None = None  # recorded after the last step's copies
        self._alloc(max_tokens, max_seqs, max_blocks)

    def _alloc(self, max_tokens: int, max_seqs: int, max_blocks: int) -> None:
        dev = self.device
        self.max_tokens, self.max_seqs, self.max_blocks = max_tokens, max_seqs, max_blocks
        self.input_ids = torch.zeros(max_tokens, dtype=torch.int64, device=dev)  # [T]
        self.positions = torch.zeros(max_tokens, dtype=torch.int64, device=dev)  # [T]
        self.slot_mapping = torch.full((max_tokens,), -1, dtype=torch.int64, device=dev)  # [T]
        self.query_start_loc = torch.zeros(max_seqs + 1, dtype=torch.int32, device=dev)  # [S + 1]
        self.seq_lens = torch.zeros(max_seqs, dtype=torch.int32, device=dev)  # [S]
        # Flat, so that a step's [S, W] view is contiguous whatever W: [max_seqs * max_blocks]
        self.block_tables = torch.zeros(max_seqs * max_blocks, dtype=torch.int32, device=dev)
        self.sample_rows = torch.zeros(max_seqs, dtype=torch.int64, device=dev)  # [B]
        self.on_host = dev.type == "cpu"
        pin = not self.on_host and torch.cuda.is_available()
        self.host: dict[str, np.ndarray] = {
            name: (t if self.on_host else torch.empty(t.shape, dtype=t.dtype, pin_memory=pin)).numpy()
            for name in self.NAMES
            for t in (getattr(self, name),)
        }

    def upload(self, name: str, n: int, shape: tuple[int, ...] | None = None) -> torch.Tensor:
        """The device view of the first n entries of buffer `name` (reshaped to `shape`), holding what
        prepare() wrote into `host[name][:n]`."""
        view = getattr(self, name)[:n]
        if not self.on_host:
            view.copy_(torch.from_numpy(self.host[name][:n]), non_blocking=True)
        return view if shape is None else view.view(shape)

    def uploaded(self) -> None:
        """The step's copies are queued: mark them, so that host_free() can wait for them."""
        if not self.on_host and self.device.type == "cuda":
            self._uploaded = torch.cuda.Event()
            self._uploaded.record()

    def host_free(self) -> None:
        """Wait until the last step's copies have read the host mirrors (nothing to wait for on the CPU)."""
        if self._uploaded is not None:
            self._uploaded.synchronize()
            self._uploaded = None

    def fit(self, tokens: int, seqs: int, blocks: int) -> None:
        if tokens <= self.max_tokens and seqs <= self.max_seqs and blocks <= self.max_blocks:
            return
        if self.frozen:
            raise RuntimeError(
                f"step needs {tokens} tokens, {seqs} sequences, {blocks} blocks per sequence; the buffers "
                f"captured by CUDA graphs hold {self.max_tokens}, {self.max_seqs}, {self.max_blocks}"
            )
        self._alloc(max(tokens, self.max_tokens), max(seqs, self.max_seqs), max(blocks, self.max_blocks))

    @staticmethod
    def put(buffer: torch.Tensor, values: np.ndarray) -> torch.Tensor:
        """Copy `values` into the front of `buffer`; return that view (same address every step)."""
        view = buffer[: values.size].view(values.shape)
        view.copy_(torch.from_numpy(values), non_blocking=False)
        return view


@dataclass(slots=True)
class SequenceLayout:
    """One sequence of a step as the runner lays it out (built from its own request state)."""

    request_id: str
    # The tokens whose KV this step computes (a placeholder id where the host does not know it yet).
    token_ids: list[int]
    start_pos: int
    sample: bool
    fork_of: str | None = None  # a fork (no tokens) samples from this request's last row

    @property
    def context_len(self) -> int:
        return self.start_pos + len(self.token_ids)


# The columns prepare() reads from each SequenceLayout, all at once in C.
_COLUMNS = attrgetter("request_id", "token_ids", "start_pos", "sample")


def _columns(seqs: list[SequenceLayout]) -> tuple[tuple, ...]:
    """(request ids, token id lists, start positions, sample flags), one tuple each."""
    return tuple(zip(*map(_COLUMNS, seqs), strict=True)) if seqs else ((), (), (), ())


def _fork_sample_rows(seqs: list[SequenceLayout]) -> tuple[list[str], list[int]]:
    """(ids of the sampled sequences, the flat row of the logits each samples from) for a step with forks:
    a fork has no tokens of its own and samples from its parent's last row."""
    last_row: dict[str, int] = {}
    num_tokens = 0
    for s in seqs:
        if s.token_ids:
            num_tokens += len(s.token_ids)
            last_row[s.request_id] = num_tokens - 1
        elif s.fork_of is None:
            raise ValueError(f"sequence {s.request_id} has no tokens and is not a fork")
    ids, rows = [], []
    for s in seqs:
        if s.sample:
            source = s.request_id if s.token_ids else s.fork_of
            if source not in last_row:
                raise ValueError(f"fork {s.request_id}: parent {source} has no tokens in this step")
            ids.append(s.request_id)
            rows.append(last_row[source])
    return ids, rows


@dataclass(frozen=True)
class PreparedStep:
    input_ids: torch.Tensor  # [T] int64 (T includes padding rows)
    positions: torch.Tensor  # [T] int64
    meta: AttentionMetadata
    sample_rows: torch.Tensor  # [B] int64: the row of each sampled sequence's logits in the flat batch
    sample_ids: list[str]  # [B] request ids, in batch order
    num_padded_seqs: int  # padding sequences appended (0 when not padded)


class InputBatch:
    def __init__(
        self,
        block_size: int,
        device: torch.device,
        max_tokens: int = 2048,
        max_seqs: int = 64,
        max_blocks: int = 64,
        rows: BatchRows | None = None,
    ) -> None:
        """rows: the persistent batch whose block tables steps read (default: one of its own)."""
        self.block_size = block_size
        self.rows = rows if rows is not None else BatchRows(1, rows=max_seqs, width=max_blocks)
        self.buffers = DeviceBuffers(device, max_tokens, max_seqs, max_blocks)
        self._arange = np.arange(0, dtype=np.int64)  # 0, 1, 2, ...: sliced, never written

    def prepare(
        self,
        seqs: list[SequenceLayout],
        pad_to: int | None = None,
        full_width: bool = False,
    ) -> PreparedStep:
        """Lay out `seqs`; their block tables are their rows of `self.rows`.
        pad_to: pad a decode-only batch with dummy sequences up to this many. full_width: block tables as
        wide as the buffer (fixed shapes for CUDA graphs) instead of the step's longest table."""
        rids, toks, starts, samples = _columns(seqs)
        qlens = list(map(len, toks))
        forked = None
        if 0 in qlens:  # forks: they sample, but have no tokens to lay out
            forked = _fork_sample_rows(seqs)
            rids, toks, starts, samples = _columns([s for s in seqs if s.token_ids])
            qlens = list(map(len, toks))
        ids = list(chain.from_iterable(toks))
        row_of = self.rows.row_of
        rows = np.array([row_of[rid] for rid in rids], dtype=np.int64)
        decode_only = len(ids) == len(qlens)  # one token per sequence
        return self.lay_out(
            list(rids), rows, ids, starts, None if decode_only else qlens, samples, forked, pad_to, full_width
        )

    def lay_out(
        self,
        rids: list[str],
        row_arr: np.ndarray,
        ids: Sequence[int] | np.ndarray,
        starts: Sequence[int] | np.ndarray,
        qlens: Sequence[int] | None,
        samples: Sequence[bool] | np.ndarray | None,
        forked: tuple[list[str], list[int]] | None = None,
        pad_to: int | None = None,
        full_width: bool = False,
    ) -> PreparedStep:
        """`prepare` from columns: per sequence its request id, row [S] int64, start position and query
        length (qlens None: one token each, a decode-only step), whether it samples (None: all do); the
        flat token ids [T]; forked: (sampled ids, their flat rows) for a step with forks."""
        bs = self.block_size
        tables = self.rows
        self.buffers.host_free()
        num_real, real_tokens = len(rids), len(ids)
        decode_only = qlens is None
        pad = pad_to - num_real if pad_to is not None and pad_to > num_real and decode_only else 0
        num_seqs, num_tokens = num_real + pad, real_tokens + pad
        buf = self.buffers
        start = np.asarray(starts, dtype=np.int64)  # [S]
        q = None if qlens is None else np.asarray(qlens, dtype=np.int64)  # [S]
        width = -(-int((start + (1 if q is None else q)).max()) // bs) if num_real else 1
        num_samples = len(forked[0]) if forked is not None else num_real
        buf.fit(num_tokens, max(num_seqs, num_samples), width)
        table = tables.table
        if width > table.shape[1]:
            raise ValueError(f"a sequence needs {width} blocks but its table holds {table.shape[1]}")
        # Written straight into the buffers' host mirrors; padding sequences get position 0, slot -1,
        # context length 1 and an all-zero block table row.
        host = buf.host
        if len(self._arange) <= num_tokens + num_seqs:
            self._arange = np.arange(2 * (num_tokens + num_seqs) + 1, dtype=np.int64)
        input_ids = host["input_ids"][:num_tokens]  # [T]
        input_ids[:real_tokens] = ids
        input_ids[real_tokens:] = 0
        pos = host["positions"][:num_tokens]  # [T]
        seq_lens = host["seq_lens"][:num_seqs]  # [S] int32
        qsl = host["query_start_loc"][: num_seqs + 1]  # [S + 1] int32
        if decode_only:  # token i is sequence i: positions are the starts, no per-token index arithmetic
            pos[:num_real] = start
            pos[num_real:] = 0
            np.add(pos, 1, out=seq_lens, casting="unsafe")
            qsl[:] = self._arange[: num_seqs + 1]
            token_rows, real_pos = row_arr, pos[:real_tokens]
        else:
            assert q is not None
            last = np.cumsum(q)  # [S]: end of each sequence's tokens
            qsl[0] = 0
            qsl[1:] = last
            seq_of = np.repeat(self._arange[:num_real], q)  # [T]
            pos[:] = self._arange[:num_tokens] - (last - q)[seq_of] + start[seq_of]
            seq_lens[:] = start + q
            token_rows, real_pos = row_arr[seq_of], pos
        slots = host["slot_mapping"][:num_tokens]  # [T]
        slots[:real_tokens] = table[token_rows, real_pos // bs] * bs + real_pos % bs
        slots[real_tokens:] = -1
        out_width = buf.max_blocks if full_width else width
        block_tables = host["block_tables"][: num_seqs * out_width].reshape(num_seqs, out_width)  # [S, W]
        block_tables[:num_real, :width] = table[row_arr, :width]
        block_tables[:num_real, width:] = 0
        block_tables[num_real:] = 0

        if forked is not None:
            sample_ids, sample_list = forked
            host["sample_rows"][:num_samples] = sample_list
        elif samples is None or all(samples):  # every sequence samples from its last token
            sample_ids = list(rids)
            np.subtract(qsl[1 : num_real + 1], 1, out=host["sample_rows"][:num_real])
        else:
            sample_ids = list(compress(rids, samples))
            num_samples = len(sample_ids)
            host["sample_rows"][:num_samples] = (qsl[1 : num_real + 1] - 1)[np.array(samples, dtype=bool)]

        up = buf.upload
        seq_lens_cpu = tuple(seq_lens.tolist())
        meta = AttentionMetadata(
            slot_mapping=up("slot_mapping", num_tokens),
            query_start_loc=up("query_start_loc", num_seqs + 1),
            seq_lens=up("seq_lens", num_seqs),
            block_tables=up("block_tables", num_seqs * out_width, (num_seqs, out_width)),
            max_query_len=1 if qlens is None else max(qlens),
            max_seq_len=max(seq_lens_cpu),
            is_decode_only=decode_only,
            query_lens_cpu=(1,) * num_seqs if qlens is None else tuple(qlens),
            seq_lens_cpu=seq_lens_cpu,
        )
        step = PreparedStep(
            input_ids=up("input_ids", num_tokens),
            positions=up("positions", num_tokens),
            meta=meta,
            sample_rows=up("sample_rows", num_samples),
            sample_ids=sample_ids,
            num_padded_seqs=pad,
        )
        buf.uploaded()
        return step
