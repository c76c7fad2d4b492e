"""A stand-in for LLMEngine with the same API, for fast tests of the worker's Redis side.

Sample k of a request emits one letter per step, chosen from (prompt, seed, k, position) only, so a
resumed request continues exactly where an uninterrupted one would.
"""

from __future__ import annotations

import threading
import time
import zlib
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from engine import Chat, EngineClient, Prompt, RejectReason, RequestRejected, SamplingParams
from engine.outputs import EngineStats, StepDelta
from tests.helpers.waiting import wait_until  # noqa: F401 (re-exported for the worker tests)
from worker.config import WorkerConfig
from worker.connection import connect
from worker.run.loop import Worker


class FakeTokenizer:
    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def decode(self, ids: list[int]) -> str:
        return bytes(ids).decode(errors="replace")

    def __len__(self) -> int:
        return 256


@dataclass
class _Sample:
    request_id: str
    index: int
    prompt: list[int]
    params: SamplingParams
    out: list[int] = field(default_factory=list)
    emitted_from: int = 0
    aborted: bool = False


class FakeEngine:
    def __init__(
        self,
        max_num_seqs: int = 64,
        num_blocks: int = 4096,
        block_size: int = 16,
        step_s: float = 0.002,
        max_prompt_tokens: int | None = None,
    ):
        self.tokenizer = FakeTokenizer()
        self.max_model_len = 512
        self.max_prompt_tokens = min(max_prompt_tokens or self.max_model_len, self.max_model_len - 1)
        self.max_num_seqs, self.num_blocks, self.block_size, self.step_s = (
            max_num_seqs,
            num_blocks,
            block_size,
            step_s,
        )
        self.samples: list[_Sample] = []
        self.generated = 0
        self.batch_sizes: list[int] = []  # requests in each step, for batching tests

    def _encode(self, prompt: Prompt) -> list[int]:
        # Like LLMEngine, the fake renders chat messages and tokenizes: the worker hands prompts over as is.
        if isinstance(prompt, Chat):
            prompt = "".join(f"<{m['role']}>{m['content']}" for m in prompt.messages) + "<assistant>"
        return self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)

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
        params = params or SamplingParams()
        if any(s.request_id == request_id for s in self.samples):
            raise RequestRejected(RejectReason.DUPLICATE_ID, f"request {request_id} is already running")
        ids = self._encode(prompt)
        if any(t >= len(self.tokenizer) for t in ids):
            raise RequestRejected(RejectReason.BAD_TOKEN_IDS, "prompt token ids out of range")
        if len(ids) > self.max_prompt_tokens:
            raise RequestRejected(
                RejectReason.PROMPT_TOO_LONG,
                f"prompt has {len(ids)} tokens, the limit is {self.max_prompt_tokens}",
            )
        if params.max_tokens is None:  # as LLMEngine: until the context is full, within the cap
            room = self.max_model_len - len(ids)
            cap = room if max_tokens_cap is None else min(room, max_tokens_cap)
            params = params.model_copy(update={"max_tokens": max(1, cap)})
        assert params.max_tokens is not None
        if len(ids) + params.max_tokens > self.max_model_len:
            raise RequestRejected(
                RejectReason.TOO_LONG_FOR_MODEL, "prompt plus max_tokens exceeds max_model_len"
            )
        for k in range(params.n):
            prior = list(prior_output_token_ids[k]) if prior_output_token_ids else []
            self.samples.append(_Sample(request_id, k, ids, params, prior, len(prior)))
        return len(ids)

    @staticmethod
    def token(sample: _Sample, position: int) -> int:
        seed = sample.params.seed or 0
        return 97 + zlib.crc32(bytes(sample.prompt) + f"{seed}:{sample.index}:{position}".encode()) % 26

    def step(self) -> list[StepDelta]:
        time.sleep(self.step_s)
        self.batch_sizes.append(len({s.request_id for s in self.samples}))
        # One token per sample still producing (the fake has no prefill to compute).
        self._step_tokens: dict[str, int] = {}
        for s in self.samples:
            if not s.aborted and len(s.out) < (s.params.max_tokens or 0):
                self._step_tokens[s.request_id] = self._step_tokens.get(s.request_id, 0) + 1
        deltas = []
        for s in list(self.samples):
            new = []
            if not s.aborted and len(s.out) < (s.params.max_tokens or 0):
                new = [self.token(s, len(s.out))]
                s.out.extend(new)
                self.generated += 1
            done = s.aborted or len(s.out) >= (s.params.max_tokens or 0)
            reason = "abort" if s.aborted else "length"
            deltas.append(
                StepDelta(
                    request_id=s.request_id,
                    sample_index=s.index,
                    new_token_ids=new,
                    text_delta=self.tokenizer.decode(new),
                    first_index=len(s.out) - len(new),
                    finished=done,
                    finish_reason=reason if done else None,
                    num_prompt_tokens=len(s.prompt),
                    text=self.tokenizer.decode(s.out) if done else None,
                    num_output_tokens=len(s.out),
                )
            )
            if done:
                self.samples.remove(s)
        return deltas

    def abort(self, request_id: str) -> bool:
        hit = [s for s in self.samples if s.request_id == request_id]
        for s in hit:
            s.aborted = True
        return bool(hit)

    def has_unfinished_requests(self) -> bool:
        return bool(self.samples)

    def step_tokens(self) -> dict[str, int]:
        return dict(getattr(self, "_step_tokens", {}))

    def blocks_used(self) -> int:
        return sum(-(-(len(s.prompt) + len(s.out)) // self.block_size) for s in self.samples if not s.aborted)

    def stats(self) -> EngineStats:
        used = self.blocks_used()
        return EngineStats(
            len(self.samples), 0, self.num_blocks, used, self.num_blocks - used, 0, 0, 0, self.generated
        )

    def free_capacity(self) -> tuple[int, int]:
        return self.max_num_seqs - len(self.samples), self.num_blocks - self.blocks_used()

    def kv_waste(self) -> tuple[int, int]:
        held = self.blocks_used() * self.block_size
        written = sum(len(s.prompt) + len(s.out) for s in self.samples if not s.aborted)
        return held - written, held

    def expected_text(self, prompt: str, max_tokens: int, seed: int | None = None, sample: int = 0) -> str:
        s = _Sample(
            "x", sample, self.tokenizer.encode(prompt), SamplingParams(max_tokens=max_tokens, seed=seed)
        )
        return self.tokenizer.decode([self.token(s, j) for j in range(max_tokens)])


if TYPE_CHECKING:  # mypy (.ci/run) checks that the fake is an EngineClient, signatures included
    _: EngineClient = FakeEngine()


def blocked_clients(client) -> int:
    """Clients blocked in Redis (an idle worker waits in XREADGROUP BLOCK)."""
    return int(client.info("clients")["blocked_clients"])


class RecordingEngine(FakeEngine):
    """The fake engine, noting the order jobs were added in (those it accepted)."""

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self.added: list[str] = []

    def add_request(self, request_id, prompt, params=None, **kwargs) -> int:
        n = super().add_request(request_id, prompt, params, **kwargs)
        self.added.append(request_id)
        return n


@contextmanager
def on_a_thread(worker):
    """Run a Worker on a thread; warm-stopped (drained) on exit, which must end it."""
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.stop.request()
        thread.join(timeout=30)
        assert not thread.is_alive(), "worker did not stop"


@contextmanager
def running_worker(engine, url: str, served: str | Sequence[str] = (), **overrides):
    """A Worker on a thread; warm-stopped (drained) on exit. `served`: model name(s) the worker registry
    shows it serving from its stream, as `conveyor worker` is shown (the clients route by them)."""
    cfg = WorkerConfig(**{"group": "test", "consumer": "w1", "lease_ms": 3000, **overrides})
    worker = Worker(engine, connect(url), cfg)
    beats = [_record(url, cfg, model) for model in ([served] if isinstance(served, str) else served)]
    for beat in beats:
        beat.start()
    try:
        with on_a_thread(worker):
            yield worker
    finally:
        for beat in beats:
            beat.stop()


def _record(url: str, cfg: WorkerConfig, model: str):
    from worker.fleet.heartbeat import Heartbeat

    return Heartbeat(
        connect(url),
        cfg.keys,
        consumer=f"{cfg.consumer}-{model}",
        model=model,
        group=cfg.group,
        streams=[cfg.keys.requests],
        max_model_len=4096,
        capacity=16,
    )


ENGINE_KW = {"num_kv_blocks": 256, "max_num_seqs": 16, "max_num_batched_tokens": 512}


def real_engine(model: str, **overrides):
    from engine import LLMEngine

    return LLMEngine(model, **{**ENGINE_KW, **overrides})


def spawn_worker(url: str, model: str, consumer: str, log_path, *extra: str):
    """`conveyor worker` in a subprocess, JSON logs to log_path."""
    import os
    import subprocess
    import sys

    args = [sys.executable, "-m", "worker.cli", "worker", "--model", model, "--redis-url", url]
    args += ["--consumer", consumer, "--group", "test", "--metrics-port", "0", "--num-kv-blocks", "256"]
    args += ["--max-num-seqs", "16", "--max-num-batched-tokens", "512", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return subprocess.Popen(args, cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=open(log_path, "wb"))


def log_lines(path) -> list[dict]:
    import json

    out = []
    for line in open(path, "rb").read().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out
