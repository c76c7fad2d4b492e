"""What the model runner calls once per step, and what both samplers (host and device) share.

    launch(logits [B, V_padded], view)  ->  SampledIds: queued on the device, read by the host once
    view: the step's rows of the persistent batch (`engine.batch_view.RowView`), row i of logits = position i

`__call__(logits, requests)` is launch + read for callers that hold request objects (tests, benchmarks):
the sampler keeps its own persistent batch of them (`RequestRows`), so state kept between steps works the
same way as under the runner.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from engine.batch_view import RowView
from engine.outputs import TokenLogprobs
from engine.sampling.request_rows import RequestRows, SamplingRequest


@dataclass(frozen=True)
class SamplerResult:
    token_ids: list[int]
    # Per request: None unless its params.logprobs is set; else the sampled token first, then the top-k by
    # descending logprob (the sampled token may appear twice).
    logprobs: list[TokenLogprobs | None]


class SampledIds:
    """One step's sampled ids as the device holds them, read by the host only when it needs them.

    `tokens()`: [B] int64 on the device (the next step's input ids take them from here, async scheduling);
    `read()`: the step's one device-to-host transfer, done once (ids, and logprobs when asked)."""

    def __init__(
        self,
        tokens: torch.Tensor | None,
        read: Callable[[], SamplerResult],
        device: torch.device | None = None,
    ) -> None:
        self._tokens, self._read, self._device = tokens, read, device
        self._result: SamplerResult | None = None

    @classmethod
    def ready(cls, result: SamplerResult, device: torch.device) -> SampledIds:
        """Ids the host already holds (the host sampler): tokens() is built from them when asked."""
        done = cls(None, lambda: result, device)
        done._result = result
        return done

    def tokens(self) -> torch.Tensor:
        if self._tokens is None:
            self._tokens = torch.tensor(self.read().token_ids, dtype=torch.int64).to(self._device)
        return self._tokens

    def read(self) -> SamplerResult:
        if self._result is None:
            self._result = self._read()
        return self._result


class TokenSampler(Protocol):
    """One token (and optional logprobs) per row of logits. `launch` queues the work and returns at once
    where the device allows; `__call__` is launch + read over request objects."""

    def launch(self, logits: torch.Tensor, view: RowView) -> SampledIds: ...

    def __call__(self, logits: torch.Tensor, requests: list[SamplingRequest]) -> SamplerResult: ...


class RowSampler:
    """The part both samplers share: the request-object entry point, and the logprobs read back."""

    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self.requests = RequestRows(vocab_size, self.eos_token_ids)

    def launch(self, logits: torch.Tensor, view: RowView) -> SampledIds:
        raise NotImplementedError

    def __call__(self, logits: torch.Tensor, requests: list[SamplingRequest]) -> SamplerResult:
        return self.launch(logits, self.requests.sync(requests)).read()


def vocab_logits(logits: torch.Tensor, rows: int, vocab_size: int) -> torch.Tensor:
    """logits [rows, V_padded] -> the view [rows, vocab_size]: the padding columns never count."""
    if logits.dim() != 2 or logits.shape[0] != rows or logits.shape[1] < vocab_size:
        raise ValueError(f"logits {tuple(logits.shape)} do not fit {rows} requests x vocab {vocab_size}")
    return logits[:, :vocab_size]


def logprob_rows(logits: torch.Tensor, tokens: torch.Tensor, view: RowView) -> torch.Tensor:
    """What the host reads when logprobs are asked: [B, 2 + 2 k] float64 (id, its logprob, the top-k ids,
    their logprobs) of the raw logits [B, V] (log_softmax before penalties, as vLLM returns by default)."""
    raw = torch.log_softmax(logits, dim=-1)  # [B, V]
    max_k = min(int(view.logprobs.max()), raw.shape[1])
    tokens = tokens.to(raw.device)[:, None]
    parts = [tokens.double(), raw.gather(1, tokens).double()]
    if max_k > 0:
        top = raw.topk(max_k, dim=-1)
        parts += [top.indices.double(), top.values.double()]
    return torch.cat(parts, dim=1)


def unpack_logprobs(host: list[list[float]], asked: np.ndarray) -> SamplerResult:
    """`logprob_rows` as read by the host, and each row's logprobs asked ([B] int64, -1 none)."""
    max_k = (len(host[0]) - 2) // 2 if host else 0
    out: list[TokenLogprobs | None] = []
    for row, n in zip(host, asked.tolist(), strict=True):
        if n < 0:
            out.append(None)
            continue
        top_ids, top_lp = row[2 : 2 + max_k], row[2 + max_k :]
        out.append(
            [(int(row[0]), row[1])] + [(int(i), v) for i, v in zip(top_ids[:n], top_lp[:n], strict=True)]
        )
    return SamplerResult([int(row[0]) for row in host], out)
