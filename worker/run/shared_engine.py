"""One engine shared by the lanes' workers: stepped once per cycle, its deltas split by lane.

A lanes worker (run/lanes_worker.py) runs one `Worker` per lane (a cluster shard, a shard on one Redis, a
split stream), each with its lane's keys, over one engine. Each gets an `EngineView`: the first view to
step in a cycle steps the real engine, and every view then takes the deltas of its own jobs. A view
reports work while the engine has any (so an idle lane's worker does rounds, never a long blocking read,
while other lanes' jobs run) or while deltas of its own wait to be taken. (Attribute names say "shard"
for a lane: `shard_of`, `step_for(shard)`.)
"""

from __future__ import annotations

import time
from collections.abc import Callable

from engine.client import EngineClient
from engine.errors import RejectReason, RequestRejected
from engine.outputs import StepDelta


class SharedEngine:
    def __init__(self, engine: EngineClient, shards: int) -> None:
        self.engine = engine
        self.shard_of: dict[str, int] = {}  # request id -> the shard it was read from
        self.samples_left: dict[str, int] = {}  # request id -> samples not finished yet
        self.buckets: list[list[StepDelta]] = [[] for _ in range(shards)]
        self.stepped = False
        self.step_s = 0.0  # wall time of this cycle's engine step (0: none), for accounting
        # Jobs a shard has read but not yet added to the engine (set by the sharded worker): each view's
        # free capacity leaves room for the other shards' jobs on their way in.
        self.reserved: Callable[[int], int] = lambda shard: 0
        self.views = [EngineView(self, k) for k in range(shards)]

    def add_view(self) -> EngineView:
        """A view for a lane added at run time (run/lanes_worker.py's add_lane)."""
        self.buckets.append([])
        self.views.append(EngineView(self, len(self.views)))
        return self.views[-1]

    def new_cycle(self) -> None:
        self.stepped = False
        self.step_s = 0.0

    def step_for(self, shard: int) -> list[StepDelta]:
        if not self.stepped and self.engine.has_unfinished_requests():
            self.stepped = True
            began = time.perf_counter()
            deltas = self.engine.step()
            self.step_s = time.perf_counter() - began
            for delta in deltas:
                owner = self.shard_of.get(delta.request_id)
                if owner is None:  # not added through a view: nobody publishes it
                    continue
                self.buckets[owner].append(delta)
                if delta.finished:
                    self._sample_finished(delta.request_id)
        taken, self.buckets[shard] = self.buckets[shard], []
        return taken

    def _sample_finished(self, request_id: str) -> None:
        """Forget a request's shard once all its samples (n of them) have finished."""
        self.samples_left[request_id] -= 1
        if self.samples_left[request_id] <= 0:
            del self.samples_left[request_id], self.shard_of[request_id]


class EngineView:
    """The EngineClient one shard's Worker sees."""

    def __init__(self, shared: SharedEngine, shard: int) -> None:
        self.shared, self.shard = shared, shard

    def add_request(self, request_id: str, prompt, params=None, **kwargs) -> int:
        shared = self.shared
        if request_id in shared.shard_of:
            # The engine knows requests by id alone: the same id on two shards would mix their tokens.
            raise RequestRejected(
                RejectReason.DUPLICATE_ID,
                f"request {request_id!r} is already running (from shard {shared.shard_of[request_id]})",
            )
        shared.shard_of[request_id] = self.shard
        shared.samples_left[request_id] = max(1, getattr(params, "n", 1) or 1)
        try:
            return shared.engine.add_request(request_id, prompt, params, **kwargs)
        except BaseException:
            del shared.shard_of[request_id], shared.samples_left[request_id]
            raise

    def step(self) -> list[StepDelta]:
        return self.shared.step_for(self.shard)

    def abort(self, request_id: str) -> bool:
        return self.shared.engine.abort(request_id)

    def has_unfinished_requests(self) -> bool:
        return self.shared.engine.has_unfinished_requests() or bool(self.shared.buckets[self.shard])

    def stats(self):
        return self.shared.engine.stats()

    def free_capacity(self) -> tuple[int, int]:
        slots, blocks = self.shared.engine.free_capacity()
        others = sum(self.shared.reserved(k) for k in range(len(self.shared.buckets)) if k != self.shard)
        return max(0, slots - others), max(0, blocks - others)

    def __getattr__(self, name: str):
        # Anything else (tokenizer, config) is the engine's own.
        return getattr(self.shared.engine, name)
