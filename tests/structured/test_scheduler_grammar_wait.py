"""The core scheduler's hook: a request waiting for its grammar is never scheduled until released."""

from __future__ import annotations

from engine.core.request import RequestStatus
from tests.helpers.engine_core_utils import make_request, make_scheduler


def _ids(out) -> list[str]:
    return [s.request_id for s in out.sequences]


def test_waiting_for_grammar_is_skipped_until_released_while_others_run():
    s = make_scheduler()
    held = make_request("g", [1, 2, 3])
    held.status = RequestStatus.WAITING_FOR_GRAMMAR
    s.add_request(held)
    s.add_request(make_request("free", [4, 5, 6]))
    assert _ids(s.schedule()) == ["free"]
    s.check_invariants()
    assert s.stats().num_waiting == 1 and _ids(s.schedule()) == ["free"]
    s.release_grammar("g")
    assert held.status is RequestStatus.WAITING
    assert _ids(s.schedule()) == ["free", "g"]
    s.check_invariants()


def test_abort_while_waiting_for_grammar_forgets_the_request():
    s = make_scheduler()
    held = make_request("g", [1, 2, 3])
    held.status = RequestStatus.WAITING_FOR_GRAMMAR
    s.add_request(held)
    assert s.abort_request("g") and not s.has_unfinished_requests()
    assert s.grammar_wait == {} and held.status is RequestStatus.FINISHED_ABORTED
    s.check_invariants()
