"""Samples 1..n-1 of an n > 1 request, waiting to fork from sample 0 once its prompt is computed.

Sample 0 (the parent) prefills the prompt; each sibling then starts from the parent's blocks and last
logits instead of prefilling the same prompt again. A sibling only waits while its parent has sampled
nothing yet: one added later, or one whose parent finished or sampled without it, becomes an ordinary
waiting request and finds the prompt in the prefix cache. Plain bookkeeping: the scheduler moves requests.
"""

from __future__ import annotations

from collections.abc import Iterator

from engine.core.request import Request, RequestStatus


class ForkWaitlist:
    def __init__(self) -> None:
        # Parent request id -> siblings waiting to fork from its first sampled step.
        self._siblings: dict[str, list[Request]] = {}
        # Group id -> its sample-0 request while siblings may still fork from it.
        self._parents: dict[str, Request] = {}

    def add(self, request: Request) -> bool:
        """Record a new request; True when it is a sibling that now waits for its parent."""
        fresh = request.num_output_tokens == 0
        if request.sample_index == 0:
            if fresh and request.params.n > 1:
                self._parents[request.group_id] = request
            return False
        parent = self._parents.get(request.group_id) if fresh else None
        if parent is None:
            return False
        request.status = RequestStatus.WAITING_FOR_FORK
        self._siblings.setdefault(parent.request_id, []).append(request)
        return True

    def is_empty(self) -> bool:
        """No parent to remember and no sibling waiting: release() would do nothing for anyone."""
        return not self._parents and not self._siblings

    def num_siblings(self, parent: Request) -> int:
        return len(self._siblings.get(parent.request_id, ()))

    def release(self, request: Request) -> list[Request]:
        """Nothing can fork from `request` any more (it forks now, sampled, or finished): its waiting
        siblings, if any, in order, for the caller to fork or to queue as ordinary requests."""
        if self._parents.get(request.group_id) is request:
            del self._parents[request.group_id]
        return self._siblings.pop(request.request_id, [])

    def discard(self, sibling: Request) -> None:
        """A waiting sibling ended (aborted) before its fork."""
        for parent_id, siblings in list(self._siblings.items()):
            if sibling in siblings:
                siblings.remove(sibling)
                if not siblings:
                    del self._siblings[parent_id]

    def reserved_slots(self) -> int:
        """Sequence slots held for siblings of running parents, so they have room when the prefill ends."""
        running = RequestStatus.RUNNING
        return sum(
            len(self._siblings.get(p.request_id, ())) for p in self._parents.values() if p.status is running
        )

    def __iter__(self) -> Iterator[Request]:
        for siblings in self._siblings.values():
            yield from siblings

    def __len__(self) -> int:
        return sum(len(s) for s in self._siblings.values())
