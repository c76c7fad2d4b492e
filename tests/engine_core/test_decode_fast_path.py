"""The scheduler's decode fast path: steps that need no new block skip the allocator, and the finish rules
and fork bookkeeping it skips give the same results."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.core.block_manager import KVBlockManager
from engine.core.finish_rules import StopTriggers, check_stop
from engine.core.fork_waitlist import ForkWaitlist
from tests.helpers.engine_core_utils import (
    EOS,
    make_group,
    make_request,
    make_requests,
    make_scheduler,
    run_step,
)


def test_has_room_is_whether_the_table_holds_the_tokens():
    kv = KVBlockManager(num_blocks=8, block_size=4, enable_prefix_caching=False)
    req = make_request("a", [1, 2, 3, 4, 5])
    assert not kv.has_room("a", 1)  # no table yet
    kv.allocate_slots(req, 5)  # two blocks
    assert kv.has_room("a", 8) and not kv.has_room("a", 9)


def test_fork_waitlist_is_empty_until_a_group_parent_arrives():
    forks = ForkWaitlist()
    assert forks.is_empty()
    forks.add(make_request("solo", [1, 2]))
    assert forks.is_empty()  # n == 1: nothing to remember
    parent, sibling = make_group("g", [1, 2, 3], 2)
    forks.add(parent)
    assert not forks.is_empty()
    forks.add(sibling)
    forks.release(parent)
    assert forks.is_empty()


def test_decode_steps_call_the_allocator_only_when_a_block_fills(monkeypatch):
    sched = make_scheduler(block_size=4, enable_prefix_caching=False)
    (req,) = make_requests(1, 3, 9)
    sched.add_request(req)
    calls: list[int] = []
    allocate = sched.kv.allocate_slots

    def counting(request, n, *args):
        calls.append(request.num_computed_tokens + n)  # tokens the table must hold after it
        return allocate(request, n, *args)

    monkeypatch.setattr(sched.kv, "allocate_slots", counting)
    tables = []
    while sched.has_unfinished_requests():
        out, _ = run_step(sched)
        tables.append((tables[-1] if tables else 0) + len(out.sequences[0].new_block_ids))
    # Prefill of 3 tokens, then decodes at context 4..11: a new block only at tokens 5 and 9.
    assert calls == [3, 5, 9]
    assert tables == [1, 1, 2, 2, 2, 2, 3, 3, 3]
    assert req.num_output_tokens == 9


@settings(max_examples=300, deadline=None)
@given(
    prompt_len=st.integers(1, 12),
    num_out=st.integers(1, 12),
    max_tokens=st.one_of(st.none(), st.integers(1, 12)),
    min_tokens=st.integers(0, 4),
    stop_ids=st.lists(st.integers(0, 9), max_size=3),
    ignore_eos=st.booleans(),
    max_model_len=st.integers(2, 30),
    token=st.integers(0, 9),
)
def test_stop_triggers_hold_whenever_check_stop_ends_a_request(
    prompt_len, num_out, max_tokens, min_tokens, stop_ids, ignore_eos, max_model_len, token
):
    """update_from_output calls check_stop only when a trigger holds: it must never miss a finish."""
    if max_tokens is not None:
        min_tokens = min(min_tokens, max_tokens)
    req = make_request(
        "a", [1] * prompt_len, 8, output=[3] * (num_out - 1) + [token], min_tokens=min_tokens,
        stop_token_ids=stop_ids, ignore_eos=ignore_eos,
    )  # fmt: skip
    req.params = req.params.model_copy(update={"max_tokens": max_tokens})  # None: as before resolution
    eos = frozenset({EOS})
    triggers = StopTriggers(req, eos, max_model_len)
    if check_stop(req, token, eos, max_model_len) is not None:
        assert token in triggers.token_ids or num_out >= triggers.num_outputs


def test_a_stop_token_sampled_mid_run_finishes_through_the_triggers():
    sched = make_scheduler()
    req = make_request("a", [1, 2], 8, stop_token_ids=[9])
    sched.add_request(req)
    assert req.stop_triggers is not None and 9 in req.stop_triggers.token_ids
    tokens = iter([5, 9, 5])
    while sched.has_unfinished_requests():
        run_step(sched, lambda s: next(tokens))
    assert req.output_token_ids == [5, 9] and req.finish_reason == "stop"
