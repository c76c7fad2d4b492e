"""Weighted fair share over lanes (a lane per tenant), counted in tokens.

This is the virtual token counter of Sheng et al., "Fairness in Serving Large Language Models" (OSDI
2024), applied where a pull-based worker decides: at intake. Each lane k has a counter of the service
its jobs were given, in tokens divided by its weight w_k (`charge`). The round's room goes one job at a
time to the backlogged lane (hungry: its last read was full) with the smallest counter, each job adding
`job_cost` / w_k to a provisional counter (a job's cost is not known before it runs), so one round is
split in proportion to the weights too; the real tokens are charged as they are served. A lane that
becomes backlogged again starts at the smallest counter of the backlogged lanes (it banks no credit
while idle). The lanes that are not backlogged are probed with one entry, one lane a round, the longest
waiting first, but not in a round after a probe that found nothing (ReadPolicy.may_probe), so a tenant
whose jobs start to arrive is seen within about two rounds per idle lane (one while the probes find
work); after `patience` rounds any lane is read one entry first
(intake/read_policy.py). Ties go to the lane that waited longest.

A flood in one lane cannot delay another lane's jobs behind it: the other lane's counter stays
smaller, so its entries are read first once it has any.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from worker.intake.read_policy import ReadPolicy

if TYPE_CHECKING:
    from engine.outputs import StepDelta


def served_tokens(deltas: Iterable[StepDelta]) -> int:
    """The service a step gave, what a lane is charged: its completion tokens, plus each job's prompt
    tokens (the whole prompt, prefix-cache hits included) with its first token. A resumed job's prompt is
    not charged again; a job with n samples pays its prompt once."""
    total = 0
    for d in deltas:
        total += len(d.new_token_ids)
        if d.first_index == 0 and d.sample_index == 0 and d.new_token_ids:
            total += d.num_prompt_tokens
    return total


class FairShare(ReadPolicy):
    def __init__(self, weights: list[float], patience: int = 4, job_cost: float = 1.0) -> None:
        if not weights or min(weights) <= 0:
            raise ValueError("every lane needs a weight > 0")
        super().__init__(len(weights), patience)
        self.weights = list(weights)
        self.job_cost = job_cost
        self.counter = [0.0] * len(weights)  # tokens given / weight
        self.hungry = [True] * len(weights)  # unknown: read as if backlogged until a read says otherwise

    def split(self, room: int, first: int) -> list[int]:
        shares = [0] * self.lanes
        backlogged = self.by_wait([k for k in range(self.lanes) if self.hungry[k]])
        idle = self.by_wait([k for k in range(self.lanes) if not self.hungry[k]])
        if not backlogged:  # short queues everywhere: the longest waiting lane reads it all
            shares[idle[0]] = room
            return shares
        left = room
        if idle and self.may_probe(left, idle[0]):
            shares[idle[0]], left = 1, left - 1
        provisional = {k: self.counter[k] for k in backlogged}
        for _ in range(left):
            k = min(backlogged, key=lambda k: provisional[k])  # stable: ties to the longest waiting
            shares[k] += 1
            provisional[k] += self.job_cost / self.weights[k]
        return shares

    def add_lane(self, weight: float = 1.0) -> int:
        """A tenant's lane added at run time: it starts level with the smallest counter of the others
        (no credit for the time before it existed, and no debt either)."""
        if not weight > 0:
            raise ValueError("every lane needs a weight > 0")
        start = min(self.counter)
        lane = super().add_lane()
        self.weights.append(weight)
        self.counter.append(start)
        return lane

    def read_back(self, lane: int, asked: int, got: int) -> None:
        was = self.hungry[lane]
        super().read_back(lane, asked, got)
        if self.hungry[lane] and not was:  # backlogged again: no credit banked while it was idle
            others = [self.counter[k] for k in range(self.lanes) if self.hungry[k] and k != lane]
            if others:
                self.counter[lane] = max(self.counter[lane], min(others))

    def charge(self, lane: int, cost: int) -> None:
        self.counter[lane] += cost / self.weights[lane]
