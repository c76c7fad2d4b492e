"""Iteration-level scheduler: one token budget per step, running requests first, then admissions.

Each step every running request is offered `num_tokens - num_computed_tokens` new tokens (a decode is 1,
a prefill chunk is whatever the budget leaves), so chunked prefill, decode and recompute after
preemption are one rule. When the pool runs dry the last request of `running` is preempted: `running`
is kept in admission order (FCFS) or by (priority, arrival) so that request is always the least
deserving one, and it has not been scheduled yet in this step. A waiting request whose next prompt
blocks another admitted request is computing right now is passed over until they are cached
(DEFER_MIN_TOKENS), so jobs of one prefix that arrive together compute it once.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.config import SchedulerConfig
from engine.core.block_manager import KVBlockManager
from engine.core.finish_rules import StopTriggers, check_stop
from engine.core.fork_waitlist import ForkWaitlist
from engine.core.request import Request, RequestStatus
from engine.core.request_queue import make_queue
from engine.core.scheduler_output import NewRequest, RunnerOutput, ScheduledSequence, SchedulerOutput
from engine.errors import RejectReason, RequestRejected

__all__ = ["RequestRejected", "Scheduler", "SchedulerStats"]

_RUNNING = RequestStatus.RUNNING
# A waiting request whose next this many prompt tokens (or more) are being computed by an admitted request
# waits until they are cached (a step, or a chunked prefill's steps) instead of computing them again beside
# it: two jobs of one prefix read together compute it once. SGLang's scheduler deprioritizes such a
# request the same way (in-batch prefix caching, 32 tokens).
DEFER_MIN_TOKENS = 32


@dataclass(frozen=True)
class SchedulerStats:
    num_running: int
    num_waiting: int
    num_blocks_total: int
    num_blocks_used: int
    num_blocks_free: int
    num_cached_blocks: int
    prefix_cache_queries: int  # tokens looked up on admission
    prefix_cache_hits: int  # of those, tokens found
    num_preemptions: int


class Scheduler:
    def __init__(self, config: SchedulerConfig, eos_token_ids: Iterable[int]) -> None:
        self.config = config
        self.eos_token_ids = frozenset(eos_token_ids)
        # reserve_max: each request's table is sized for max_model_len on admission (check_request has
        # made sure no request grows past it), so only admissions allocate.
        reserve = config.max_model_len if config.kv_allocation == "reserve_max" else None
        self.kv = KVBlockManager(
            config.num_blocks, config.block_size, config.enable_prefix_caching, reserve_tokens=reserve
        )
        self._tables = self.kv.tables  # the block manager's dict (never replaced), read per request per step
        # Every unfinished request by id (the runner reads sampling parameters from here).
        self.requests: dict[str, Request] = {}
        self.waiting = make_queue(config.policy)
        self.running: list[Request] = []
        self.forks = ForkWaitlist()
        # Requests added in WAITING_FOR_GRAMMAR, by id, until release_grammar() queues them.
        self.grammar_wait: dict[str, Request] = {}
        # Static batching: group ids of the current batch, fixed when it starts (the first max_num_seqs
        # waiting requests); only they are admitted until the batch is gone, even if their prefill takes
        # several steps. Group ids, so that the samples of an n > 1 request stay in their batch.
        self._static_batch: set[str] = set()
        self.num_preemptions = 0
        # Ids the runner holds that finished since the last schedule() (it drops their state).
        self._finished_ids: list[str] = []

    # ------------------------------------------------------------------ requests

    def check_request(self, request: Request) -> None:
        """Raise RequestRejected when the request could never run, whatever else is queued."""
        cfg = self.config
        if request.num_prompt_tokens == 0:
            raise RequestRejected(RejectReason.EMPTY_PROMPT, "the prompt is empty")
        total = request.max_total_tokens
        if total > cfg.max_model_len:
            raise RequestRejected(
                RejectReason.TOO_LONG_FOR_MODEL,
                f"prompt ({request.num_prompt_tokens} tokens) + max_tokens ({request.params.max_tokens}) = "
                f"{total} exceeds max_model_len ({cfg.max_model_len})",
            )
        blocks = self.kv.blocks_at_admission(total)
        if blocks > cfg.num_blocks:
            what = f"{total} tokens need"
            if self.kv.reserve_tokens is not None:
                what = f"reserve_max reserves max_model_len ({cfg.max_model_len}) tokens per request:"
            raise RequestRejected(
                RejectReason.TOO_LONG_FOR_KV_CACHE,
                f"{what} {blocks} KV blocks of {cfg.block_size} tokens, but the whole pool has {cfg.num_blocks}",
            )

    def add_request(self, request: Request) -> None:
        self.check_request(request)
        if request.request_id in self.requests:
            raise RequestRejected(
                RejectReason.DUPLICATE_ID, f"request id {request.request_id!r} is already queued"
            )
        self.requests[request.request_id] = request
        request.stop_triggers = StopTriggers(request, self.eos_token_ids, self.config.max_model_len)
        if self.forks.add(request):
            return
        if request.status is RequestStatus.WAITING_FOR_GRAMMAR:
            self.grammar_wait[request.request_id] = request
            return
        request.status = RequestStatus.WAITING
        self.waiting.add(request)

    def release_grammar(self, request_id: str) -> None:
        """The request's grammar is ready: it queues like any new request."""
        request = self.grammar_wait.pop(request_id)
        request.status = RequestStatus.WAITING
        self.waiting.add(request)

    def get_request(self, request_id: str) -> Request | None:
        return self.requests.get(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def finish_request(self, request_id: str, status: RequestStatus) -> bool:
        """End a request from outside (a stop string matched, or an abort); frees its blocks now."""
        if not status.is_finished:
            raise ValueError(f"{status} is not a finished status")
        request = self.requests.get(request_id)
        if request is None:
            return False
        self._finish(request, status)
        return True

    def abort_request(self, request_id: str) -> bool:
        return self.finish_request(request_id, RequestStatus.FINISHED_ABORTED)

    # ------------------------------------------------------------------ one step

    def schedule(self) -> SchedulerOutput:
        cfg = self.config
        budget = cfg.max_num_batched_tokens
        step = _Step(no_forks=self.forks.is_empty())
        running = self.running
        was_running = bool(running)

        # Running requests, most of them decoding; a request whose table already holds its tokens skips
        # the allocator.
        has_room = self.kv.has_room
        for request in running:  # preemption pops from the back, which this loop has not reached
            if budget <= 0:
                break
            start = request.num_computed_tokens
            pending = request.num_output_placeholders
            if pending and _at_limit(request, pending):
                continue  # the step in flight returns its last token, and finishes it
            total = len(request.prompt_token_ids) + len(request.output_token_ids) + pending
            n = min(total - start, budget)
            if not has_room(request.request_id, start + n) and not self._allocate_or_preempt(
                request, n, step
            ):
                break  # it was the last one, and preempted itself
            self._schedule(request, n, total, step)
            budget -= n

        static = cfg.scheduling == "static"
        if static and not was_running:
            firsts = zip(self.waiting, range(cfg.max_num_seqs), strict=False)
            self._static_batch = {r.group_id for r, _ in firsts}
        num_seqs = len(running) + len(step.forked) + self.forks.reserved_slots()
        deferred: list[Request] = []  # their next block is being computed: admitted in a later step
        while self.waiting and budget > 0 and num_seqs < cfg.max_num_seqs and not step.preempted:
            request = self.waiting.peek()
            if static and request.group_id not in self._static_batch:
                break
            cached = self.kv.get_computed_blocks(request)
            if self.kv.num_tokens_computing(request, cached) >= DEFER_MIN_TOKENS:
                deferred.append(self.waiting.pop())
                continue
            n = min(request.num_tokens - cached.num_tokens, budget)
            if self.kv.allocate_slots(request, n, cached) is None:
                break
            self.waiting.pop()
            request.status = _RUNNING
            request.num_computed_tokens = request.num_cached_tokens = cached.num_tokens
            self._add_running(request)
            num_seqs += 1 + self.forks.num_siblings(request)
            self._schedule(request, n, request.num_tokens, step)
            budget -= n

        for request in reversed(deferred):
            self.waiting.add_front(request)
        for sibling in step.forked:
            self._add_running(sibling)
        for sibling in reversed(step.unforked):
            sibling.status = RequestStatus.WAITING
            self.waiting.add_front(sibling)
        finished, self._finished_ids = self._finished_ids, []
        return SchedulerOutput(
            sequences=step.sequences,
            num_batched_tokens=cfg.max_num_batched_tokens - budget,
            new_requests=step.new_requests,
            block_copies=step.copies,
            preempted_ids=step.preempted,
            finished_ids=finished,
        )

    def update_from_output(
        self, scheduler_output: SchedulerOutput, runner_output: RunnerOutput
    ) -> list[Request]:
        """Append samples, decide who finished. Returns, in batch order, the requests that got a token this
        step (finished ones included; they already left `running`). A request preempted after this step was
        scheduled (async scheduling) still gets its token; one finished or aborted since does not."""
        sampled = runner_output.sampled_token_ids
        updated: list[Request] = []
        add = updated.append
        any_finished = False
        requests, eos, max_model_len = self.requests, self.eos_token_ids, self.config.max_model_len
        cache_blocks = self.kv.enable_prefix_caching
        forks = not self.forks.is_empty()
        for seq in scheduler_output.sequences:
            rid = seq.request_id
            request = requests.get(rid)
            if request is None:
                continue  # finished (or aborted) after this step was scheduled
            if not seq.sample:
                if cache_blocks:
                    self.kv.cache_full_blocks(request)
                continue
            token = sampled[rid]
            request.num_output_placeholders -= 1
            request.append_output_token(token)
            if cache_blocks:
                self.kv.cache_full_blocks(request)
            if forks:
                self._release_forks(request)  # siblings added after the fork was scheduled
            triggers = request.stop_triggers
            if (
                triggers is None
                or token in triggers.token_ids
                or len(request.output_token_ids) >= triggers.num_outputs
            ):
                status = check_stop(request, token, eos, max_model_len)
                if status is not None:
                    self._finish(request, status, leave_running=True)
                    any_finished = True
            add(request)
        if any_finished:
            self.running = [r for r in self.running if r.status is _RUNNING]
        return updated

    # ------------------------------------------------------------------ introspection

    def stats(self) -> SchedulerStats:
        kv = self.kv
        return SchedulerStats(
            num_running=len(self.running),
            num_waiting=len(self.waiting) + len(self.forks) + len(self.grammar_wait),
            num_blocks_total=kv.num_blocks,
            num_blocks_used=kv.num_used_blocks,
            num_blocks_free=kv.num_free_blocks,
            num_cached_blocks=kv.pool.num_cached,
            prefix_cache_queries=kv.prefix_cache_queries,
            prefix_cache_hits=kv.prefix_cache_hits,
            num_preemptions=self.num_preemptions,
        )

    def free_capacity(self) -> tuple[int, int]:
        """(sequence slots not taken by any unfinished request, free blocks including evictable cached ones)."""
        return max(0, self.config.max_num_seqs - len(self.requests)), self.kv.num_free_blocks

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping is inconsistent (tests call it after every step)."""
        self.kv.check_invariants()
        waiting = list(self.waiting)
        forking = list(self.forks)
        compiling = list(self.grammar_wait.values())
        for r in self.running:
            assert r.status is _RUNNING, f"{r.request_id} in running with status {r.status}"
            assert len(self.kv.block_ids(r.request_id)) >= self.kv.blocks_needed(r.num_computed_tokens)
        for r in waiting:
            assert r.status in (RequestStatus.WAITING, RequestStatus.PREEMPTED), f"{r.request_id}: {r.status}"
        for r in forking:
            assert r.status is RequestStatus.WAITING_FOR_FORK, f"{r.request_id}: {r.status}"
        for r in compiling:
            assert r.status is RequestStatus.WAITING_FOR_GRAMMAR, f"{r.request_id}: {r.status}"
        everyone = self.running + waiting + forking + compiling
        assert len(everyone) == len(self.requests), "a request is in two places or in none"
        assert {r.request_id for r in everyone} == set(self.requests), "containers disagree with requests"
        holders = {r.request_id for r in self.running}
        assert self.kv.table_owners() <= holders, "a request off `running` holds blocks"

    # ------------------------------------------------------------------ helpers

    def _allocate_or_preempt(self, request: Request, n: int, step: _Step) -> bool:
        """Make room for n more tokens of `request` by preempting from the back of `running`.
        False when `request` itself had to go."""
        while self.kv.allocate_slots(request, n) is None:
            victim = self.running.pop()
            self._preempt(victim)
            step.preempted.append(victim.request_id)
            if victim is request:
                return False
        return True

    def _schedule(self, request: Request, n: int, total: int, step: _Step) -> None:
        """Schedule the next n of the `total` tokens (placeholders included) of a request whose table
        holds them (running or just admitted).

        Its computed tokens advance now (vLLM's rule), so that with async scheduling the next step can be
        scheduled before this one's sampled token is back: that token is then a placeholder."""
        start = request.num_computed_tokens
        end = start + n
        sample = end == total
        rid = request.request_id
        table = self._tables[rid]
        sent = request.num_blocks_sent
        if not request.sent_to_runner:
            request.sent_to_runner = True
            step.new_requests.append(_new_request(request))
        step.sequences.append(ScheduledSequence(rid, n, start, table[sent:], sample, sent == 0))
        request.num_blocks_sent = len(table)
        request.num_computed_tokens = end
        if sample:
            request.num_output_placeholders += 1
            if not step.no_forks and self.forks.num_siblings(request):
                self._fork(request, step)

    def _fork(self, parent: Request, step: _Step) -> None:
        """Siblings sample from the parent's last logits this step; those without a slot or a block fall
        back to recomputing the prompt as ordinary requests (cheap: the prefix cache holds it)."""
        siblings = self.forks.release(parent)
        free_slots = (
            self.config.max_num_seqs - len(self.running) - len(step.forked) - self.forks.reserved_slots()
        )
        for sibling in siblings:
            fork = self.kv.fork(parent, sibling) if free_slots > 0 else None
            if fork is None:
                step.unforked.append(sibling)
                continue
            free_slots -= 1
            sibling.status = _RUNNING
            sibling.sent_to_runner = True
            step.copies.extend(fork.block_copies)
            step.forked.append(sibling)
            step.new_requests.append(_new_request(sibling))
            table = self.kv.tables[sibling.request_id]
            start = parent.num_prompt_tokens
            step.sequences.append(
                ScheduledSequence(sibling.request_id, 0, start, table, True, True, parent.request_id)
            )
            sibling.num_blocks_sent = len(table)
            sibling.num_computed_tokens = start
            sibling.num_output_placeholders += 1

    def _add_running(self, request: Request) -> None:
        if self.config.policy == "priority":
            bisect.insort(self.running, request, key=lambda r: (r.priority, r.arrival_time))
        else:
            self.running.append(request)

    def _preempt(self, request: Request) -> None:
        self.kv.free(request)
        request.status = RequestStatus.PREEMPTED
        request.num_computed_tokens = 0
        request.num_blocks_sent = 0  # the runner gets its whole new table when it resumes
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.add_front(request)

    def _release_forks(self, parent: Request) -> None:
        """The parent can no longer be forked from: its waiting siblings become ordinary requests."""
        for sibling in reversed(self.forks.release(parent)):
            sibling.status = RequestStatus.WAITING
            self.waiting.add_front(sibling)

    def _finish(self, request: Request, status: RequestStatus, leave_running: bool = False) -> None:
        """Take the request out of its container (unless the caller filters `running` itself), free its
        blocks now and forget it."""
        prev = request.status
        if prev is _RUNNING:
            if not leave_running:
                self.running.remove(request)
        elif prev is RequestStatus.WAITING_FOR_FORK:
            self.forks.discard(request)
        elif prev is RequestStatus.WAITING_FOR_GRAMMAR:
            del self.grammar_wait[request.request_id]
        else:
            self.waiting.remove(request)
        request.status = status
        self.kv.free(request)
        del self.requests[request.request_id]
        if request.sent_to_runner:
            self._finished_ids.append(request.request_id)
        self._release_forks(request)


@dataclass
class _Step:
    """What one schedule() call has decided so far."""

    sequences: list[ScheduledSequence] = field(default_factory=list)
    new_requests: list[NewRequest] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)
    # Siblings forked in this step: they join `running` after the step is built.
    forked: list[Request] = field(default_factory=list)
    # Siblings whose fork failed: they join `waiting` after the step is built.
    unforked: list[Request] = field(default_factory=list)
    # No sibling waits for a fork (true in most steps; none can be added while the step is built).
    no_forks: bool = False


def _new_request(request: Request) -> NewRequest:
    return NewRequest(
        request.request_id,
        request.prompt_token_ids,
        request.params,
        request.sample_index,
        list(request.output_token_ids),
    )


def _at_limit(request: Request, pending: int) -> bool:
    """With `pending` sampled tokens not back yet: whether they already reach its max_tokens or context."""
    triggers = request.stop_triggers
    return triggers is not None and len(request.output_token_ids) + pending >= triggers.num_outputs
