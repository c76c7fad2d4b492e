"""A persistent batch fed from request objects, for callers that hold requests rather than a runner's rows
(the samplers' `__call__`, tests, benchmarks): `sync(requests)` brings the rows up to date with them.

A request new to the batch gets a row; one whose tokens grew gets the new ones appended; an object that
replaces another under the same request_id (a new request reusing an id), or one with fewer tokens than
its row (another history), starts over; requests absent from the list lose their rows.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from engine.batch_rows import BatchRows
from engine.batch_view import RowView
from engine.sampling_params import SamplingParams


class SamplingRequest(Protocol):
    """What a row is made from: a scheduler `Request` has these fields."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams
    sample_index: int


class RequestRows(BatchRows):
    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int] = frozenset()) -> None:
        super().__init__(vocab_size, eos_token_ids)
        self._objects: dict[str, SamplingRequest] = {}

    def sync(self, requests: list[SamplingRequest]) -> RowView:
        """The rows of `requests`, in their order, holding their tokens as of now."""
        wanted = {r.request_id for r in requests}
        for rid in [rid for rid in self.ids if rid not in wanted]:
            self.remove(rid)
            del self._objects[rid]
        for r in requests:
            rid, row = r.request_id, self.row_of.get(r.request_id)
            if row is not None and self._objects[rid] is not r:
                self.remove(rid)
                row = None
            if row is None:
                self.add(rid, r.prompt_token_ids, r.output_token_ids, r.params, r.sample_index)
                self._objects[rid] = r
                continue
            known = int(self.num_tokens[row]) - len(r.prompt_token_ids)
            outputs = r.output_token_ids
            if len(outputs) < known:
                self.set_tokens(row, [*r.prompt_token_ids, *outputs])
            for t in outputs[known:]:
                self.append_tokens(np.array([row]), np.array([t], dtype=np.int64))
        return self.view([r.request_id for r in requests])
