"""Pick the next token of every running request from the model's logits.

Per step, for logits [B, V_padded] float32 (row i belongs to requests[i]), in this order:
  1. cut the padding columns: only the tokenizer's `vocab_size` columns count;
  2. logprobs, when asked for, are log_softmax of these *raw* logits (as vLLM returns by default), so they
     describe the model, not the penalties/temperature/truncation of this request;
  3. penalties: repetition (HF, prompt + output), presence and frequency (OpenAI, output only);
  4. min_tokens: EOS (unless ignore_eos) and stop_token_ids get -inf while output < min_tokens;
  5. greedy rows take the argmax; the others are divided by temperature, cut by min_p / top_k / top_p and
     sampled with the exponential race `argmax(probs / q)`, q ~ Exp(1) (see `engine.sampling.noise` for how
     seeded rows stay reproducible across batches, positions and workers).
An all-greedy batch without penalties or active min_tokens is one argmax.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.request import Request
from engine.outputs import TokenLogprobs
from engine.sampling.noise import exponential_noise
from engine.sampling.penalties import apply_min_tokens, apply_penalties, min_tokens_banned, needs_penalties
from engine.sampling.truncation import truncated_probs


@dataclass(frozen=True)
class SamplerResult:
    token_ids: list[int]
    # Per request: None unless its params.logprobs is set; else the sampled token first, then the top-k by
    # descending logprob (the sampled token may appear twice).
    logprobs: list[TokenLogprobs | None]


class Sampler:
    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]):
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerResult:
        if logits.dim() != 2 or logits.shape[0] != len(requests) or logits.shape[1] < self.vocab_size:
            raise ValueError(
                f"logits {tuple(logits.shape)} do not fit {len(requests)} requests x vocab {self.vocab_size}"
            )
        logits = logits[:, : self.vocab_size].float()  # [B, V] float32, maybe a view of the input
        raw_logprobs = None
        if any(r.params.logprobs is not None for r in requests):
            raw_logprobs = torch.log_softmax(logits, dim=-1)  # [B, V] float32
        if self._plain_greedy(requests):
            tokens = logits.argmax(dim=-1)  # [B] int64
        else:
            tokens = self._sample(logits.clone(), requests)
        token_ids = tokens.tolist()
        return SamplerResult(token_ids, _gather_logprobs(raw_logprobs, tokens, requests))

    def _plain_greedy(self, requests: list[Request]) -> bool:
        return all(
            r.params.is_greedy and not needs_penalties(r) and not min_tokens_banned(r, self.eos_token_ids)
            for r in requests
        )

    def _sample(self, logits: torch.Tensor, requests: list[Request]) -> torch.Tensor:
        """logits: [B, V] float32, a private copy edited in place. Returns tokens: [B] int64."""
        if any(needs_penalties(r) for r in requests):
            apply_penalties(logits, requests)
        apply_min_tokens(logits, requests, self.eos_token_ids)
        tokens = logits.argmax(dim=-1)  # [B] int64; final for greedy rows
        random_rows = [i for i, r in enumerate(requests) if not r.params.is_greedy]
        if not random_rows:
            return tokens
        device = logits.device
        sub = [requests[i] for i in random_rows]
        rows = torch.tensor(random_rows, device=device)
        temperature = torch.tensor([r.params.temperature for r in sub], dtype=torch.float32, device=device)
        top_k = torch.tensor(
            [r.params.top_k if 0 < r.params.top_k < self.vocab_size else self.vocab_size for r in sub],
            dtype=torch.int64,
            device=device,
        )
        top_p = torch.tensor([r.params.top_p for r in sub], dtype=torch.float32, device=device)
        min_p = torch.tensor([r.params.min_p for r in sub], dtype=torch.float32, device=device)
        probs = truncated_probs(logits[rows] / temperature[:, None], top_k, top_p, min_p)  # [R, V]
        q = exponential_noise(sub, self.vocab_size, device)  # [R, V]
        tokens[rows] = (probs / q).argmax(dim=-1)
        return tokens


def _gather_logprobs(
    raw_logprobs: torch.Tensor | None, tokens: torch.Tensor, requests: list[Request]
) -> list[TokenLogprobs | None]:
    """raw_logprobs: [B, V] float32 or None; tokens: [B] int64. One device-to-host copy per tensor."""
    if raw_logprobs is None:
        return [None] * len(requests)
    max_k = max(r.params.logprobs or 0 for r in requests)
    sampled = raw_logprobs.gather(1, tokens[:, None]).squeeze(1).tolist()  # [B]
    top_values: list[list[float]] = [[] for _ in requests]
    top_ids: list[list[int]] = [[] for _ in requests]
    if max_k > 0:
        top = raw_logprobs.topk(min(max_k, raw_logprobs.shape[1]), dim=-1)  # values/indices: [B, k]
        top_values, top_ids = top.values.tolist(), top.indices.tolist()
    token_ids = tokens.tolist()
    out: list[TokenLogprobs | None] = []
    for i, r in enumerate(requests):
        k = r.params.logprobs
        if k is None:
            out.append(None)
            continue
        out.append([(token_ids[i], sampled[i])] + list(zip(top_ids[i][:k], top_values[i][:k], strict=True)))
    return out
