"""Per engine: which requests are constrained, their compiles and their grammar matchers.

Life of a constrained request:
  admit()   the compile starts (cached by spec); the request waits in WAITING_FOR_GRAMMAR (a sibling of
            an n > 1 request waits for its fork as usual), while the rest of the batch runs;
  poll()    once per step: a finished compile gives each sample its own GrammarMatcher, which first
            replays the sample's prior output (a request resumed after a takeover), then the request is
            released to the scheduler; a failed compile fails the request's samples;
  rows()    at sampling: the (row, matcher) pairs the batch mask is built from;
  accept()  after the step: each new token goes into its sample's matcher.
Matcher state belongs to the sample, not to its KV: preemption (recompute) does not touch it.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import structlog

from engine.core.request import Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.errors import FailureCode
from engine.sampling_params import SamplingParams
from engine.structured.batch_mask import MaskRows
from engine.structured.compile_process import GrammarError

log = structlog.get_logger("conveyor.engine")
# (request, why it failed, code), for the engine to finish with an error.
Failure = tuple[Request, str, FailureCode]
_INVALID = FailureCode.INVALID_PARAMS
# xgrammar is an extra (it requires triton on Linux x86-64): without it, constrained requests are refused.
NOT_INSTALLED = "structured outputs are not installed on this worker: pip install 'conveyor[structured]'"


@dataclass
class _Tracked:
    matcher: Any  # xgrammar.GrammarMatcher
    num_accepted: int  # of the request's output tokens


class StructuredOutputManager:
    def __init__(
        self, tokenizer: Any, vocab_size: int, eos_token_ids: Iterable[int], timeout_s: float = 10.0
    ) -> None:
        self._tokenizer, self.vocab_size = tokenizer, vocab_size
        self._eos, self.timeout_s = frozenset(eos_token_ids), timeout_s
        self._service: Any = None
        # Sequence id -> (request, future of its compiled grammar), until the compile ends.
        self._compiling: dict[str, tuple[Request, cf.Future]] = {}
        self._matchers: dict[str, _Tracked] = {}

    @property
    def service(self) -> Any:
        """The compiler service, made on first use so an engine without constrained requests never
        imports xgrammar nor starts a compile process."""
        if self._service is None:
            from engine.structured.compiler import GrammarCompilerService

            try:
                self._service = GrammarCompilerService(
                    self._tokenizer, self.vocab_size, self._eos, timeout_s=self.timeout_s
                )
            except ModuleNotFoundError as exc:
                if exc.name != "xgrammar":
                    raise
                raise GrammarError(NOT_INSTALLED) from None
        return self._service

    def check(self, params: SamplingParams) -> None:
        """Raise GrammarError (a ValueError) with the grammar engine's message for an invalid constraint."""
        spec = params.grammar_spec
        if spec is not None:
            self.service.check(spec)

    def admit(self, request: Request) -> None:
        spec = request.params.grammar_spec
        if spec is None:
            return
        self._compiling[request.request_id] = (request, self.service.compile(spec))
        if request.status is RequestStatus.WAITING:
            request.status = RequestStatus.WAITING_FOR_GRAMMAR

    def has_matchers(self) -> bool:
        """Whether a constrained request is running (its mask needs its last token accepted)."""
        return bool(self._matchers)

    def has_compiling(self) -> bool:
        return bool(self._compiling)

    def wait(self, timeout_s: float) -> None:
        """Block until a compile ends or `timeout_s` passes (the engine has nothing else to run)."""
        cf.wait([f for _, f in self._compiling.values()], timeout_s, return_when=cf.FIRST_COMPLETED)

    def poll(self, scheduler: Scheduler) -> list[Failure]:
        """Start the requests whose grammar is ready; return those whose compile or replay failed."""
        live: Mapping[str, Request] = scheduler.requests
        for seq_id in [s for s in self._matchers if s not in live]:
            del self._matchers[seq_id]  # finished, aborted or stopped since the last step
        # Each future is asked once, so the samples of one request (one future) start in the same step.
        done = {id(f) for _, f in self._compiling.values() if f.done()}
        failures: list[Failure] = []
        for seq_id, (request, future) in list(self._compiling.items()):
            if id(future) not in done:
                continue
            del self._compiling[seq_id]
            if live.get(seq_id) is not request:
                continue  # aborted while compiling
            error = future.exception()
            if error is not None:
                failures.append((request, str(error) or type(error).__name__, _INVALID))
                continue
            import xgrammar as xgr

            matcher = xgr.GrammarMatcher(future.result())
            tracked = _Tracked(matcher, 0)
            bad = _accept(tracked, request.output_token_ids)
            if bad is not None:
                failures.append(
                    (request, f"output token {bad} published earlier does not fit the grammar", _INVALID)
                )
                continue
            self._matchers[seq_id] = tracked
            if request.status is RequestStatus.WAITING_FOR_GRAMMAR:
                scheduler.release_grammar(seq_id)
        return failures

    def rows(self, request_ids: list[str]) -> MaskRows:
        matchers = self._matchers
        if not matchers:
            return []
        return [(i, t.matcher) for i, r in enumerate(request_ids) if (t := matchers.get(r)) is not None]

    def accept(self, requests: Iterable[Request]) -> list[Failure]:
        if not self._matchers:  # no constrained request: skip the per-request lookups
            return []
        failures: list[Failure] = []
        for request in requests:
            tracked = self._matchers.get(request.request_id)
            if tracked is None:
                continue
            try:
                bad = _accept(tracked, request.output_token_ids)
            except Exception as exc:  # a matcher bug ends this request only
                del self._matchers[request.request_id]
                log.exception("grammar matcher failed", request_id=request.group_id)
                failures.append(
                    (request, f"grammar matcher: {type(exc).__name__}: {exc}", FailureCode.INTERNAL)
                )
                continue
            if bad is not None:
                del self._matchers[request.request_id]
                failures.append((request, f"sampled token {bad} does not fit the grammar", _INVALID))
        return failures

    def close(self) -> None:
        if self._service is not None:
            self._service.close()


def _accept(tracked: _Tracked, output_token_ids: list[int]) -> int | None:
    """Feed the tokens the matcher has not seen; the first one it rejects, or None."""
    for token in output_token_ids[tracked.num_accepted :]:
        if not tracked.matcher.accept_token(token):
            return token
        tracked.num_accepted += 1
    return None
