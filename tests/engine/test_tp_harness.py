"""The shared tensor-parallel test harness and the group's collectives on two gloo ranks."""

from __future__ import annotations

import torch

from engine.distributed.partition import kv_head_span, padded_vocab, vocab_span
from tests.helpers.tp_ranks import run_on_ranks


def _collectives(group):
    x = torch.full((2, 3), float(group.rank + 1))
    group.all_reduce(x)
    cols = group.gather_columns(torch.full((2, 2), float(group.rank)))
    b = torch.tensor([group.rank * 10 + 7])
    group.broadcast(b)
    return x.tolist(), None if cols is None else cols.tolist(), b.item()


def test_collectives_on_two_ranks():
    (x0, c0, b0), (x1, c1, b1) = run_on_ranks(2, _collectives)
    assert x0 == x1 == [[3.0] * 3] * 2
    assert c0 == [[0.0, 0.0, 1.0, 1.0]] * 2 and c1 is None
    assert b0 == b1 == 7


def test_partition_rules():
    assert [kv_head_span(8, r, 4) for r in range(4)] == [(0, 2), (2, 2), (4, 2), (6, 2)]
    # Fewer KV heads than ranks: each head replicated on consecutive ranks.
    assert [tuple(kv_head_span(2, r, 4)) for r in range(4)] == [(0, 1), (0, 1), (1, 1), (1, 1)]
    assert padded_vocab(1001, 4) == 1004 and vocab_span(1001, 3, 4) == (753, 251)
