"""InputBatch lays a step out exactly as the per-token reference does, in buffers of fixed addresses."""

from __future__ import annotations

import random

import pytest
import torch

from engine.batch_rows import BatchRows
from engine.core.scheduler_output import RunnerOutput
from engine.cuda_graphs import batch_buckets, bucket_for
from engine.input_batch import InputBatch
from engine.sampling_params import SamplingParams
from tests.helpers.engine_core_utils import make_requests, make_scheduler
from tests.helpers.model_helpers import TableLayout, metadata, prepare_with_tables

BS = 4


def _check_same(step, seqs: list[TableLayout]) -> None:
    real = [s for s in seqs if s.token_ids]
    ref = metadata([(s.start_pos, len(s.token_ids), s.block_ids) for s in real], BS)
    got = step.meta
    assert torch.equal(got.slot_mapping, ref.slot_mapping)
    assert torch.equal(got.query_start_loc, ref.query_start_loc)
    assert torch.equal(got.seq_lens, ref.seq_lens)
    width = ref.block_tables.shape[1]
    assert torch.equal(got.block_tables[:, :width], ref.block_tables)
    assert not got.block_tables[:, width:].any()
    assert (got.max_query_len, got.max_seq_len, got.is_decode_only) == (
        ref.max_query_len,
        ref.max_seq_len,
        ref.is_decode_only,
    )
    assert got.query_lens_cpu == ref.query_lens_cpu and got.seq_lens_cpu == ref.seq_lens_cpu
    assert step.input_ids.tolist() == [t for s in real for t in s.token_ids]
    assert step.positions.tolist() == [p for s in real for p in range(s.start_pos, s.context_len)]


def test_random_steps_match_the_per_token_layout():
    """Requests come and go, grow their tables, prefill in chunks and decode; every step matches."""
    rng = random.Random(0)
    batch = InputBatch(BS, torch.device("cpu"), max_tokens=8, max_seqs=2, max_blocks=2)  # grows
    free = list(range(1, 400))
    rng.shuffle(free)
    live: dict[str, dict] = {}
    next_id = 0
    for _ in range(60):
        if len(live) < 6 and rng.random() < 0.4:
            live[f"r{next_id}"] = {"prompt": rng.randint(1, 13), "done": 0, "blocks": []}
            next_id += 1
        if live and rng.random() < 0.15:
            gone = rng.choice(sorted(live))
            free += live.pop(gone)["blocks"]
            batch.rows.remove(gone)
        seqs = []
        for rid, r in live.items():
            n = min(rng.randint(1, 5), r["prompt"] - r["done"]) if r["done"] < r["prompt"] else 1
            end = r["done"] + n
            while len(r["blocks"]) * BS < end:
                r["blocks"].append(free.pop())
            seqs.append(
                TableLayout(rid, [rng.randint(0, 99) for _ in range(n)], r["done"], list(r["blocks"]), True)
            )
            r["done"] = end
        if not seqs:
            continue
        _check_same(prepare_with_tables(batch, seqs), seqs)
    assert set(batch.rows.row_of) <= set(live)


def test_a_reused_request_id_gets_its_new_table():
    batch = InputBatch(BS, torch.device("cpu"))
    first = [TableLayout("a", [1] * 6, 0, [7, 8], True)]
    prepare_with_tables(batch, first)
    again = [TableLayout("a", [2] * 3, 0, [3], True)]  # the id came back with other blocks
    _check_same(prepare_with_tables(batch, again), again)


def test_buffers_keep_their_addresses():
    batch = InputBatch(BS, torch.device("cpu"), max_tokens=64, max_seqs=8, max_blocks=8)
    a = prepare_with_tables(batch, [TableLayout("a", [1, 2, 3], 0, [5], True)])
    b = prepare_with_tables(
        batch, [TableLayout("a", [4], 3, [5], True), TableLayout("b", [9, 9, 9, 9, 9], 0, [1, 2], True)]
    )
    for x, y in [(a.input_ids, b.input_ids), (a.positions, b.positions), (a.sample_rows, b.sample_rows)]:
        assert x.data_ptr() == y.data_ptr()
    for name in ("slot_mapping", "query_start_loc", "seq_lens", "block_tables"):
        assert getattr(a.meta, name).data_ptr() == getattr(b.meta, name).data_ptr(), name


def test_decode_padding_adds_inert_sequences():
    batch = InputBatch(BS, torch.device("cpu"), max_blocks=8)
    seqs = [TableLayout("a", [5], 6, [3, 4], True), TableLayout("b", [6], 1, [2], True)]
    step = prepare_with_tables(batch, seqs, pad_to=4, full_width=True)
    m = step.meta
    assert step.num_padded_seqs == 2 and step.input_ids.tolist() == [5, 6, 0, 0]
    assert m.slot_mapping.tolist() == [4 * BS + 2, 2 * BS + 1, -1, -1]
    assert m.query_start_loc.tolist() == [0, 1, 2, 3, 4] and m.seq_lens.tolist() == [7, 2, 1, 1]
    assert m.block_tables.shape == (4, 8) and not m.block_tables[2:].any()
    assert step.positions.tolist() == [6, 1, 0, 0] and step.sample_rows.tolist() == [0, 1]
    # A step with a prefill chunk is never padded.
    mixed = [TableLayout("a", [5], 7, [3, 4], True), TableLayout("c", [1, 2], 0, [9], True)]
    assert prepare_with_tables(batch, mixed, pad_to=4).num_padded_seqs == 0


def test_buckets():
    assert batch_buckets(64) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64)
    assert (
        batch_buckets(1) == (1,)
        and batch_buckets(5) == (1, 2, 4, 5)
        and batch_buckets(20) == (1, 2, 4, 8, 16, 20)
    )
    buckets = batch_buckets(64)
    assert [bucket_for(n, buckets) for n in (1, 3, 8, 9, 17, 64, 65)] == [1, 4, 8, 16, 24, 64, None]


def test_fork_without_parent_in_step_is_an_error():
    batch = InputBatch(BS, torch.device("cpu"))
    with pytest.raises(ValueError, match="parent"):
        prepare_with_tables(
            batch, [TableLayout("a", [1], 0, [1], True), TableLayout("c", [], 3, [2], True, "p")]
        )


def test_a_preempted_request_gets_its_new_table_even_if_its_last_block_matches():
    batch = InputBatch(BS, torch.device("cpu"))
    prepare_with_tables(batch, [TableLayout("a", [1] * 8, 0, [5, 9], True)])
    # Preempted (blocks freed), then recomputed into [7, 9, 11]: block 9 lands at the same index by chance.
    batch.rows.remove("a")
    again = [TableLayout("a", [1] * 9, 0, [7, 9, 11], True)]
    _check_same(prepare_with_tables(batch, again), again)


def test_block_tables_set_append_and_remove():
    """set_blocks writes the whole table (clearing a longer old one), append_blocks writes only after what
    is there, remove clears the row and moves the last row into it (rows stay dense)."""
    rows = BatchRows(16, rows=2, width=8)
    for rid in "abc":  # the third grows the rows
        rows.add(rid, [1], [], SamplingParams())
    row = rows.row_of["a"]
    rows.set_blocks("a", [5, 6])
    rows.table[row, 0] = 99  # a marker: any rewrite of the row's first entry would erase it
    rows.append_blocks("a", [7])
    assert rows.table[row, :4].tolist() == [99, 6, 7, 0]
    rows.append_blocks("a", [])
    rows.append_blocks("a", [8, 9])
    assert rows.table[row, :6].tolist() == [99, 6, 7, 8, 9, 0]
    rows.set_blocks("a", [3])  # shorter: rewritten, the tail cleared
    assert rows.table[row].tolist() == [3, 0, 0, 0, 0, 0, 0, 0]
    rows.set_blocks("c", [1, 2])
    rows.remove("a")
    assert rows.row_of == {"c": row, "b": 1} and rows.ids == ["c", "b"] and len(rows) == 2
    assert rows.table[row, :3].tolist() == [1, 2, 0] and not rows.table[2].any()
    rows.append_blocks("c", list(range(10, 20)))  # wider than the table: it grows
    assert rows.table[row, :12].tolist() == [1, 2, *range(10, 20)]
    rows.clear_blocks("c")  # preempted: the row stays, its table goes
    assert "c" in rows and not rows.table[row].any()


def test_a_block_appended_mid_run_reaches_the_runner():
    """A decode crossing a block boundary: the scheduler's diff (only the appended block) must land in
    the runner's table, whole after a first step."""
    sched = make_scheduler(block_size=BS, enable_prefix_caching=False)
    (req,) = make_requests(1, 3, 9)
    sched.add_request(req)
    batch = InputBatch(BS, torch.device("cpu"), max_blocks=8)
    batch.rows.add(req.request_id, req.prompt_token_ids, [], req.params)
    sent = []
    while sched.has_unfinished_requests():
        out = sched.schedule()
        (seq,) = out.sequences
        if seq.whole_table:
            batch.rows.set_blocks(seq.request_id, seq.new_block_ids)
        else:
            batch.rows.append_blocks(seq.request_id, seq.new_block_ids)
        tokens = req.token_ids()[seq.start_pos : seq.context_len]
        step = prepare_with_tables(
            batch, [TableLayout(req.request_id, tokens, seq.start_pos, None, seq.sample)]
        )
        full = sched.kv.block_ids(req.request_id)
        _check_same(step, [TableLayout(req.request_id, tokens, seq.start_pos, full, seq.sample)])
        sent.append(seq.new_block_ids)
        sched.update_from_output(out, RunnerOutput({req.request_id: 7}))
    assert sent == [(0,), (), (1,), (), (), (), (2,), (), ()]


def test_a_step_leaves_nothing_of_the_previous_one_in_the_buffers():
    """The step is written over the last one in place: entries past each table, and padding rows, must
    be cleared, whatever the previous step left there."""
    batch = InputBatch(BS, torch.device("cpu"), max_tokens=16, max_seqs=4, max_blocks=6)
    wide = [
        TableLayout(r, [1] * 4, 16, tuple(range(10 * k + 1, 10 * k + 6)), True) for k, r in enumerate("abcd")
    ]
    prepare_with_tables(batch, wide, full_width=True)
    narrow = [TableLayout("e", [2], 1, (9,), True), TableLayout("f", [3], 5, (7, 8), True)]
    step = prepare_with_tables(batch, narrow, pad_to=4, full_width=True)
    assert step.meta.block_tables.tolist() == [[9, 0, 0, 0, 0, 0], [7, 8, 0, 0, 0, 0]] + [[0] * 6] * 2
    assert step.meta.slot_mapping.tolist() == [9 * BS + 1, 8 * BS + 1, -1, -1]
    assert step.input_ids.tolist() == [2, 3, 0, 0] and step.positions.tolist() == [1, 5, 0, 0]


def test_random_decode_only_steps_match_the_per_token_layout():
    """Decode-only steps take their own path (no per-token index arithmetic): same layout."""
    rng = random.Random(1)
    batch = InputBatch(BS, torch.device("cpu"), max_tokens=8, max_seqs=4, max_blocks=4)
    for _ in range(20):
        seqs = []
        for k in range(rng.randint(1, 12)):
            start = rng.randint(0, 40)
            blocks = tuple(rng.sample(range(1, 500), start // BS + 1))
            seqs.append(TableLayout(f"r{k}", [rng.randint(0, 99)], start, blocks, rng.random() < 0.9))
        step = prepare_with_tables(batch, seqs)
        _check_same(step, seqs)
        expected = [i for i, s in enumerate(seqs) if s.sample]
        assert step.sample_rows.tolist() == expected and step.sample_ids == [
            seqs[i].request_id for i in expected
        ]
