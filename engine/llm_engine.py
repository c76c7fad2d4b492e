"""LLMEngine: the Python API the worker and users build on.

add_request ─▶ Scheduler.schedule() ─▶ Executor.execute() ─▶ Scheduler.update_from_output()
                                                                    │
                StepDelta (tokens, text delta, finish) ◀── TextStream (detokenize, stop strings)
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import replace
from typing import Any, cast

import structlog

from engine.attention import get_attention_backend
from engine.config import EngineConfig, SchedulerConfig, check_backend_block_size
from engine.core.finish_rules import check_stop
from engine.core.request import FINISH_REASONS, Request, RequestStatus
from engine.core.scheduler import Scheduler
from engine.core.scheduler_output import SchedulerOutput
from engine.detokenizer import Decoder, TextStream
from engine.device import DeviceBinding, resolve_device
from engine.distributed.executor import Executor
from engine.distributed.group import TPGroup
from engine.distributed.rank_processes import RankProcesses
from engine.distributed.rank_runner import build_rank_runner, rank_device
from engine.errors import FailureCode, RejectReason, RequestRejected
from engine.model_loader import ModelSpec
from engine.model_runner import PendingOutput
from engine.outputs import CompletionOutput, EngineStats, PromptLogprobs, RequestOutput, StepDelta
from engine.prompt import Chat, Prompt
from engine.sampling.interface import TokenSampler
from engine.sampling.make_sampler import make_sampler
from engine.sampling_params import SamplingParams
from engine.structured.batch_mask import GrammarMaskingSampler
from engine.structured.manager import StructuredOutputManager
from engine.token_pieces import TokenPieces
from engine.tokenizer import encode_chat, eos_token_ids, load_tokenizer

log = structlog.get_logger("conveyor.engine")

# Joins a user's request id and a sample index into the id of one sequence of an n > 1 request.
_SAMPLE_SEP = "\x1f"
_RUNNING = RequestStatus.RUNNING


class LLMEngine:
    """Continuous-batching generation over a paged KV cache.

    >>> llm = LLMEngine("path/to/checkpoint", max_num_seqs=64)
    >>> llm.generate(["Hello"], SamplingParams(max_tokens=8, temperature=0))[0].text
    """

    def __init__(self, model: str, **options: Any) -> None:
        self.config = config = EngineConfig(model=model, **options)
        # Device, attention backend and EOS ids are resolved here, once, and passed down explicitly.
        self.device = resolve_device(config.device)
        if config.enable_cuda_graphs and self.device.type != "cuda":
            raise ValueError(f"enable_cuda_graphs needs a CUDA device; this engine runs on {self.device}")
        self.attention_backend = get_attention_backend(config.attention_backend, self.device)
        check_backend_block_size(config.block_size, self.attention_backend.name)
        # Tensor parallelism: ranks 1..N-1 start loading while this process loads rank 0's shard.
        if config.tensor_parallel_size > 1:
            rank_device(self.device, config.tensor_parallel_size - 1)  # refuses more ranks than GPUs
            self.device = rank_device(self.device, 0)  # "cuda" -> "cuda:0": rank r is on cuda:r
        # This thread's current CUDA device, before the weights load (rank 0's join thread sets only its own).
        DeviceBinding(self.device).bind()
        self.ranks = RankProcesses(config, self.device) if config.tensor_parallel_size > 1 else None
        if self.ranks is not None:  # an engine dropped without close() still stops its ranks
            weakref.finalize(self, self.ranks.close)
        try:
            self._start(config)
        except BaseException:
            self.close()
            raise

    def _start(self, config: EngineConfig) -> None:
        group = self.ranks.group if self.ranks is not None else TPGroup.single()
        rank = build_rank_runner(
            config,
            self.device,
            self.attention_backend,
            group,
            sampler=self._sampler,
            collective=self.ranks.step if self.ranks is not None else nullcontext,
        )
        self.runner, self.spec, self.model = rank.runner, rank.spec, rank.runner.model
        self.max_model_len, self.num_kv_blocks = rank.max_model_len, rank.num_blocks
        self.executor = Executor(self.runner, self.ranks)
        # Longest prompt accepted: the option, and always room for one generated token.
        self.max_prompt_tokens = min(config.max_prompt_tokens or self.max_model_len, self.max_model_len - 1)
        self.scheduler = Scheduler(
            SchedulerConfig(
                num_blocks=self.num_kv_blocks,
                block_size=config.block_size,
                max_num_seqs=config.max_num_seqs,
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_model_len=self.max_model_len,
                enable_prefix_caching=config.enable_prefix_caching,
                scheduling=config.scheduling,
                policy=config.scheduling_policy,
                kv_allocation=config.kv_allocation,
            ),
            self.eos_token_ids,
        )
        # Per sequence id: its detokenizer and stop-string state, and the index of its next token.
        self._streams: dict[str, TextStream] = {}
        self._next_index: dict[str, int] = {}
        # User request id -> its sequence ids (one per sample).
        self._groups: dict[str, list[str]] = {}
        # Finishing deltas produced outside step() (aborts, resumed requests that were already done),
        # handed out by the next step().
        self._pending: list[StepDelta] = []
        self._last_scheduled: SchedulerOutput | None = None  # the last step's work (step_tokens)
        # Async scheduling: the step submitted last, whose sampled ids are not handled yet.
        self._in_flight: tuple[SchedulerOutput, PendingOutput] | None = None
        self._ids = itertools.count()
        self._num_generated_tokens = 0
        self._num_prompt_tokens = 0  # of the requests accepted by add_request (once per request, any n)

    # ------------------------------------------------------------------ requests

    def add_request(
        self,
        request_id: str,
        prompt: Prompt,
        params: SamplingParams | None = None,
        *,
        priority: int = 0,
        prior_output_token_ids: Sequence[Sequence[int]] | None = None,
        arrival_time: float | None = None,
        max_tokens_cap: int | None = None,
    ) -> int:
        """Queue a request; return its number of prompt tokens. Raises `RequestRejected` if it can never run.

        `prompt`: text (encoded with the tokenizer's BOS), token ids (used as given), or `Chat` messages
        (rendered with the model's chat template, whose own special tokens are kept and not doubled).
        `prior_output_token_ids` (one list per sample) resumes a request whose first tokens were generated
        elsewhere: they count towards `max_tokens`, and only tokens after them are emitted.
        `params.max_tokens=None` means until the context is full (max_model_len minus the prompt), and no
        more than `max_tokens_cap` when that is given.
        """
        params = params or SamplingParams()
        if request_id in self._groups:
            raise RequestRejected(RejectReason.DUPLICATE_ID, f"request id {request_id!r} is already in use")
        self.check_structured(params)
        prompt_ids = self._encode(prompt)
        if len(prompt_ids) > self.max_prompt_tokens:
            raise RequestRejected(
                RejectReason.PROMPT_TOO_LONG,
                f"prompt has {len(prompt_ids)} tokens, the limit is {self.max_prompt_tokens}",
            )
        if params.max_tokens is None:  # "until the context is full"; a prompt that fills it is refused below
            room = self.max_model_len - len(prompt_ids)  # >= 1: max_prompt_tokens < max_model_len
            cap = room if max_tokens_cap is None else min(room, max_tokens_cap)
            params = params.model_copy(update={"max_tokens": max(1, cap)})
        priors = [list(p) for p in prior_output_token_ids] if prior_output_token_ids else [[]] * params.n
        if len(priors) != params.n:
            raise RequestRejected(
                RejectReason.BAD_PRIOR_OUTPUT,
                f"prior_output_token_ids has {len(priors)} lists, expected n={params.n}",
            )
        for prior in priors:
            self._check_token_ids(prior, "prior_output_token_ids")
        arrival = time.monotonic() if arrival_time is None else arrival_time
        requests = [
            Request(
                request_id=request_id if params.n == 1 else f"{request_id}{_SAMPLE_SEP}{k}",
                prompt_token_ids=prompt_ids,
                params=params,
                arrival_time=arrival,
                priority=priority,
                sample_index=k,
                group_id=request_id,
                output_token_ids=list(priors[k]),
                status=RequestStatus.WAITING_FOR_FORK if k > 0 and not any(priors) else RequestStatus.WAITING,
            )
            for k in range(params.n)
        ]
        # Validate every sample before adding any, so a rejection leaves nothing behind.
        for request in requests:
            self.scheduler.check_request(request)
        self._groups[request_id] = [r.request_id for r in requests]
        for request in requests:
            self._streams[request.request_id] = TextStream(
                self._decoder,
                prompt_ids,
                params.stop,
                prior_output_ids=request.output_token_ids,
                profile=self._pieces.profile,
            )
            self._next_index[request.request_id] = request.num_output_tokens
        for request in requests:
            stream = self._streams[request.request_id]
            reason = self._resumed_finish_reason(request, stream)
            if reason is not None:
                self._pending.append(self._finish_delta(request, reason, stream.finish(), []))
                continue
            self.structured.admit(request)
            self.scheduler.add_request(request)
        self._num_prompt_tokens += len(prompt_ids)
        return len(prompt_ids)

    def check_structured(self, params: SamplingParams) -> None:
        """Raise GrammarError (a RequestRejected) with the grammar engine's message if the request's
        response_format / structured_outputs is invalid. Fast: parses, does not compile token masks."""
        self.structured.check(params)

    def abort(self, request_id: str) -> bool:
        """Stop a request now and free its KV blocks; its samples end with finish_reason "abort"."""
        seq_ids = self._groups.get(request_id)
        if seq_ids is None:
            return False
        for seq_id in seq_ids:
            request = self.scheduler.get_request(seq_id)
            if request is None or seq_id not in self._streams:
                continue
            self.scheduler.abort_request(seq_id)
            stream = self._streams[seq_id]
            self._pending.append(self._finish_delta(request, "abort", stream.finish(), []))
        return True

    def has_unfinished_requests(self) -> bool:
        """Raises TensorParallelError once a rank is lost: a worker asks this every pass, idle or not, so
        it ends (and its leases lapse) without waiting for a job to step."""
        if self.ranks is not None:
            self.ranks.check()
        return bool(self._pending) or self._in_flight is not None or self.scheduler.has_unfinished_requests()

    # ------------------------------------------------------------------ stepping

    def step(self) -> list[StepDelta]:
        """Run one iteration: every running sequence advances by one token (or one prefill chunk).

        With `async_scheduling` the step scheduled here is submitted, and the deltas returned are those of
        the step submitted by the previous call, handled while this one runs."""
        deltas, self._pending = self._pending, []
        deltas += self._fail_structured(self.structured.poll(self.scheduler))
        if self._in_flight is not None and self.structured.has_matchers():
            # A grammar's mask for the next step needs the token in flight accepted by its matcher first.
            deltas += self._finish_step(*self._in_flight)
            self._in_flight = None
        sched_out = self.scheduler.schedule()
        self._last_scheduled = sched_out
        if sched_out.is_empty and self._in_flight is None:
            if self.structured.has_compiling():
                self.structured.wait(0.005)  # only grammars to wait for: do not spin
            return deltas
        if not self.config.async_scheduling:
            return deltas + self._finish_step(sched_out, self.executor.submit(sched_out))
        submitted = (sched_out, self.executor.submit(sched_out)) if not sched_out.is_empty else None
        if self._in_flight is not None:
            deltas += self._finish_step(*self._in_flight)
        self._in_flight = submitted
        return deltas

    def _finish_step(self, sched_out: SchedulerOutput, pending: PendingOutput) -> list[StepDelta]:
        """Wait for a step's sampled ids; append them, decide who finished, advance grammars, build deltas."""
        runner_out = pending.result()
        updated = self.scheduler.update_from_output(sched_out, runner_out)
        rejected = self.structured.accept(updated)
        deltas = self._deltas(updated, runner_out.logprobs, runner_out.prompt_logprobs)
        return deltas + self._fail_structured(rejected) if rejected else deltas

    def _fail_structured(self, failures: list[tuple[Request, str, FailureCode]]) -> list[StepDelta]:
        """End requests whose grammar failed to compile (or rejected a token, or raised): finish_reason
        "abort", with the reason in `error` and its code in `error_code`."""
        deltas = []
        for request, error, code in failures:
            if request.request_id not in self._streams:
                continue  # already finished by the step that sampled the token
            if not request.is_finished:
                self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_ABORTED)
            stream = self._streams[request.request_id]
            delta = self._finish_delta(request, "abort", stream.finish(), [])
            deltas.append(replace(delta, error=error, error_code=code.value))
        return deltas

    def _fail_request(self, request: Request, exc: Exception) -> list[StepDelta]:
        """Handling one request's new tokens raised: that request ends (all its samples), finish_reason
        "abort" with `error_code` "internal_error"; the rest of the batch goes on."""
        log.error("request failed", request_id=request.group_id, exc_info=exc)
        seq_id = request.request_id
        if not request.is_finished:
            self.scheduler.finish_request(seq_id, RequestStatus.FINISHED_ABORTED)
        out = []
        if seq_id in self._next_index:  # not ended yet (the failure may come after its stream was dropped)
            self._streams.pop(seq_id, None)
            delta = self._make_delta(request, [], "", None, "abort")
            del self._next_index[seq_id]
            error = f"{type(exc).__name__}: {exc}"[:500]
            out.append(replace(delta, error=error, error_code=FailureCode.INTERNAL.value))
        group = self._groups.get(request.group_id, [])
        if any(s in self._streams for s in group):
            self.abort(request.group_id)  # its sibling samples end too (their deltas go out next step)
        else:
            self._groups.pop(request.group_id, None)
        return out

    def _deltas(
        self,
        updated: list[Request],
        logprobs: dict[str, list[tuple[int, float]]],
        prompt_logprobs: dict[str, PromptLogprobs],
    ) -> list[StepDelta]:
        """One StepDelta per request that got tokens this step, in batch order (256 at full batch)."""
        out: list[StepDelta] = []
        add = out.append
        streams, next_index, make = self._streams, self._next_index, self._make_delta
        generated = 0
        for request in updated:
            try:  # one request's failure ends that request only (no cost when nothing raises)
                seq_id = request.request_id
                first = next_index[seq_id]
                new_ids = request.output_token_ids[first:]
                generated += len(new_ids)
                text, stopped = streams[seq_id].append(new_ids)
                if stopped or request.status is not _RUNNING or (logprobs and seq_id in logprobs):
                    add(self._delta_for(request, new_ids, text, stopped, logprobs.get(seq_id)))
                else:
                    add(make(request, new_ids, text))
                if prompt_logprobs and seq_id in prompt_logprobs:  # the request's first token
                    self._add_prompt_logprobs(out[-1], request, prompt_logprobs[seq_id])
            except Exception as exc:
                out += self._fail_request(request, exc)
        self._num_generated_tokens += generated
        return out

    def _add_prompt_logprobs(self, delta: StepDelta, request: Request, lp: PromptLogprobs) -> None:
        """Once per request, on sample 0's first delta: its prompt's logprobs, and their pieces (the first
        prompt token, which has no logprob, lists its own piece)."""
        delta.prompt_logprobs = lp
        listed = [e for e in lp if e is not None]
        first = [self._pieces.piece(request.prompt_token_ids[0])]
        delta.prompt_logprob_tokens = [first, *self._pieces.for_logprobs(listed)]

    def _delta_for(
        self,
        request: Request,
        new_ids: list[int],
        text: str,
        stopped: bool,
        logprobs: list[tuple[int, float]] | None,
    ) -> StepDelta:
        """The delta of a request that finished in this step (or matched a stop string), or has logprobs."""
        if stopped and not request.is_finished:
            self.scheduler.finish_request(request.request_id, RequestStatus.FINISHED_STOPPED)
        lp = [logprobs] if logprobs is not None else None
        if request.is_finished:
            stream = self._streams[request.request_id]
            reason = request.finish_reason or "stop"
            return self._finish_delta(request, reason, text + stream.finish(), new_ids, lp)
        return self._make_delta(request, new_ids, text, lp)

    def _finish_delta(
        self,
        request: Request,
        reason: str,
        text: str,
        new_ids: list[int],
        logprobs: list[list[tuple[int, float]]] | None = None,
    ) -> StepDelta:
        """The last delta of a sequence; forgets its per-sequence state."""
        delta = self._make_delta(
            request, new_ids, text, logprobs, reason, self._streams.pop(request.request_id).text
        )
        del self._next_index[request.request_id]
        if not any(s in self._streams for s in self._groups[request.group_id]):
            del self._groups[request.group_id]
        return delta

    def _make_delta(
        self,
        request: Request,
        new_ids: list[int],
        text: str,
        logprobs: list[list[tuple[int, float]]] | None = None,
        finish_reason: str | None = None,
        final_text: str | None = None,
    ) -> StepDelta:
        """The one place a StepDelta is built; advances the sequence's next token index."""
        first = self._next_index[request.request_id]
        self._next_index[request.request_id] = first + len(new_ids)
        return StepDelta(
            request_id=request.group_id,
            sample_index=request.sample_index,
            new_token_ids=new_ids,
            text_delta=text,
            first_index=first,
            logprobs=logprobs,
            logprob_tokens=None if logprobs is None else self._pieces.for_logprobs(logprobs),
            finished=finish_reason is not None,
            finish_reason=finish_reason,
            num_prompt_tokens=request.num_prompt_tokens,
            text=final_text,
            num_output_tokens=first + len(new_ids),
        )

    # ------------------------------------------------------------------ whole batches

    def generate(
        self,
        prompts: Sequence[Prompt],
        params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts to completion; outputs in the order of `prompts`."""
        if isinstance(params, SamplingParams) or params is None:
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"got {len(params)} SamplingParams for {len(prompts)} prompts")
        ids = [f"generate-{next(self._ids)}" for _ in prompts]
        results: dict[str, RequestOutput] = {}
        for request_id, prompt, p in zip(ids, prompts, params, strict=True):
            self.add_request(request_id, prompt, p)
            first = self.scheduler.get_request(self._groups[request_id][0])
            assert first is not None  # just added
            results[request_id] = RequestOutput(
                request_id=request_id,
                prompt_token_ids=first.prompt_token_ids,
                outputs=[CompletionOutput(index=k) for k in range(p.n)],
            )
        while self.has_unfinished_requests():
            for delta in self.step():
                out = results[delta.request_id].outputs[delta.sample_index]
                out.token_ids.extend(delta.new_token_ids)
                out.text += delta.text_delta
                if delta.logprobs is not None:
                    out.logprobs = (out.logprobs or []) + delta.logprobs
                if delta.prompt_logprobs is not None:
                    results[delta.request_id].prompt_logprobs = delta.prompt_logprobs
                if delta.finished:
                    out.finish_reason = delta.finish_reason
        return [results[i] for i in ids]

    # ------------------------------------------------------------------ introspection

    def step_tokens(self) -> dict[str, int]:
        """Tokens whose KV the last `step()` computed, per request id (its samples together): prefill
        chunks and decoded tokens alike. Worked out when asked, from the step's schedule (one pass over
        its sequences), so the step itself does no more work for it."""
        out: dict[str, int] = {}
        if self._last_scheduled is None:
            return out
        for seq in self._last_scheduled.sequences:
            request_id = seq.request_id
            if _SAMPLE_SEP in request_id:  # sample k of an n > 1 request: counted under the request
                request_id = request_id.split(_SAMPLE_SEP, 1)[0]
            out[request_id] = out.get(request_id, 0) + seq.num_new_tokens
        return out

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            num_kv_blocks_total=s.num_blocks_total,
            num_kv_blocks_used=s.num_blocks_used,
            num_kv_blocks_free=s.num_blocks_free,
            prefix_cache_queries=s.prefix_cache_queries,
            prefix_cache_hits=s.prefix_cache_hits,
            num_preemptions=s.num_preemptions,
            num_generated_tokens=self._num_generated_tokens,
            num_prompt_tokens=self._num_prompt_tokens,
        )

    def free_capacity(self) -> tuple[int, int]:
        """(free sequence slots, free KV blocks): how much new work this engine can take at once."""
        return self.scheduler.free_capacity()

    def kv_waste(self) -> tuple[int, int]:
        """(allocated but unwritten KV slots, allocated KV slots) over the running sequences right now.

        A block shared by several sequences is counted once, with the most tokens any of them wrote in it.
        """
        block_size = self.config.block_size
        written: dict[int, int] = {}
        for request in self.scheduler.running:
            for i, block_id in enumerate(self.scheduler.kv.block_ids(request.request_id)):
                filled = min(block_size, max(0, request.num_computed_tokens - i * block_size))
                written[block_id] = max(written.get(block_id, 0), filled)
        allocated = len(written) * block_size
        return allocated - sum(written.values()), allocated

    def _sampler(self, spec: ModelSpec) -> TokenSampler:
        """Rank 0's text side and sampler, made once the model is loaded (build_rank_runner calls it):
        constrained decoding's masks are as wide as the LM head (spec.vocab_size), not the tokenizer."""
        self.tokenizer = load_tokenizer(self.config.model)
        # transformers types decode for batches too (str | list[str]); on a flat id list it returns a str.
        self._decoder = cast(Decoder, self.tokenizer)
        self._pieces = TokenPieces(self.tokenizer)
        self.eos_token_ids = eos_token_ids(self.tokenizer, spec.eos_token_ids)
        self.structured = StructuredOutputManager(self.tokenizer, spec.vocab_size, self.eos_token_ids)
        return GrammarMaskingSampler(
            make_sampler(spec.vocab_size, self.eos_token_ids, self.device),
            self.structured.rows,
            spec.vocab_size,
        )

    def close(self) -> None:
        """Stop the tensor-parallel ranks (if any). Idempotent; also run when the engine is garbage
        collected and at interpreter exit."""
        if self.ranks is not None:
            self.ranks.close()

    def __enter__(self) -> LLMEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ helpers

    def _encode(self, prompt: Prompt) -> list[int]:
        if isinstance(prompt, Chat):
            ids = self._encode_chat(prompt)
        elif isinstance(prompt, str):
            if not prompt:
                raise RequestRejected(RejectReason.EMPTY_PROMPT, "the prompt is empty")
            ids = self.tokenizer.encode(prompt, add_special_tokens=True)
        else:
            ids = list(prompt)
            self._check_token_ids(ids, "prompt token ids")
        if not ids:
            raise RequestRejected(RejectReason.EMPTY_PROMPT, "the prompt is empty")
        return ids

    def _encode_chat(self, chat: Chat) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise RequestRejected(
                RejectReason.NO_CHAT_TEMPLATE,
                "this model has no chat template; send `prompt` instead of `messages`",
            )
        try:
            return encode_chat(self.tokenizer, [dict(m) for m in chat.messages])
        except Exception as exc:  # a template may raise anything (jinja errors, its own raise_exception)
            raise RequestRejected(RejectReason.BAD_MESSAGES, f"messages: {exc}") from None

    def _check_token_ids(self, ids: list[int], what: str) -> None:
        vocab = self.spec.vocab_size
        for t in ids:
            if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < vocab:
                raise RequestRejected(
                    RejectReason.BAD_TOKEN_IDS, f"{what} must be ints in [0, {vocab}); got {t!r}"
                )

    def _resumed_finish_reason(self, request: Request, stream: TextStream) -> str | None:
        """Why a resumed sample had already finished before it was resubmitted (None: it goes on)."""
        if not request.output_token_ids:
            return None
        if stream.stopped:
            return "stop"
        status = check_stop(request, request.output_token_ids[-1], self.eos_token_ids, self.max_model_len)
        return FINISH_REASONS[status] if status is not None else None
