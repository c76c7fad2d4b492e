"""Prompt logprobs (params.prompt_logprobs): the log-probability of each prompt token given those before it.

The logits at position p predict token p + 1, so prompt token i (i >= 1) is scored by the logits of
position i - 1; position L - 1 (the prompt's last) predicts the first output, which the sampler takes.
A request that asks keeps the logits of the prompt positions of each chunk it computes, as extra rows
after the step's sampled rows:

    prompt (L = 6):   t0  t1  t2  t3  t4  t5
    chunk 1 (3 tok):  p0  p1  p2              rows p0, p1, p2 -> logprobs of t1, t2, t3
    chunk 2 (3 tok):              p3  p4  p5  rows p3, p4 -> t4, t5; p5 is the sampled row

Only requests that ask pay: the others' logits stay at their last position. A chunk recomputed after a
preemption fills the same entries again. The whole list goes out once, in the step of the request's first
sampled token (the runner keeps it until then). A cached prefix has no logits, so such a request skips the
prefix cache (engine/core/block_manager.py), as vLLM does.
"""

from __future__ import annotations

import torch

from engine.outputs import PromptLogprobs, TokenLogprobs

# Rows whose log_softmax is taken at once: the logits of a long prompt chunk ([P, V] float32, P up to
# max_num_batched_tokens) are not copied whole a second time.
SLICE_ROWS = 256


class PromptScores:
    """One request's prompt logprobs as its chunks' rows come back; entry 0 is always None."""

    def __init__(self, prompt_token_ids: list[int], k: int) -> None:
        self.prompt = prompt_token_ids
        self.k = k
        self.entries: PromptLogprobs = [None] * len(prompt_token_ids)
        self._missing = set(range(1, len(prompt_token_ids)))  # prompt indices not scored yet
        self.sent = False

    def positions(self, start: int, num_tokens: int) -> range:
        """Positions of a chunk [start, start + num_tokens) whose logits score a prompt token."""
        return range(start, min(start + num_tokens, len(self.prompt) - 1))

    def fill(self, position: int, entry: TokenLogprobs) -> None:
        """The logits at `position` scored prompt token position + 1."""
        self.entries[position + 1] = entry
        self._missing.discard(position + 1)

    @property
    def complete(self) -> bool:
        return not self._missing


class PromptRows:
    """The prompt rows of one step: which request and position each row is, and their logprobs on the device
    until `read()` (one device-to-host copy per tensor, when the step's sampled ids are read)."""

    def __init__(self) -> None:
        self.scores: list[PromptScores] = []  # [P]: whose row
        self.positions: list[int] = []  # [P]: the row's position in its request
        self.flat_rows: list[int] = []  # [P]: the row in the step's flat batch
        self.targets: list[int] = []  # [P]: the prompt token its logits score
        self._token: torch.Tensor | None = None  # [P] float32: the target's logprob
        self._top: tuple[torch.Tensor, torch.Tensor] | None = None  # values [P, k_max] f32, ids [P, k_max]

    def add(self, scores: PromptScores, start: int, num_tokens: int, flat_start: int) -> None:
        for p in scores.positions(start, num_tokens):
            self.scores.append(scores)
            self.positions.append(p)
            self.flat_rows.append(flat_start + p - start)
            self.targets.append(scores.prompt[p + 1])

    def __len__(self) -> int:
        return len(self.positions)

    def launch(self, logits: torch.Tensor, vocab_size: int) -> None:
        """logits: [P, V_padded] of these rows, in order. Queues the log_softmax, gather and top-k."""
        targets = torch.tensor(self.targets, dtype=torch.int64, device=logits.device)  # [P]
        k_max = min(max(s.k for s in self.scores), vocab_size)
        token, values, ids = [], [], []
        for at in range(0, logits.shape[0], SLICE_ROWS):
            rows = slice(at, at + SLICE_ROWS)
            logprobs = torch.log_softmax(logits[rows, :vocab_size].float(), dim=-1)  # [S, V]
            token.append(logprobs.gather(1, targets[rows, None]).squeeze(1))  # [S]
            if k_max > 0:
                top = logprobs.topk(k_max, dim=-1)  # [S, k_max]
                values.append(top.values)
                ids.append(top.indices)
        self._token = torch.cat(token)  # [P]
        if k_max > 0:
            self._top = (torch.cat(values), torch.cat(ids))  # [P, k_max] each

    def read(self) -> None:
        """Fill each row's request's entry (waits for the device)."""
        assert self._token is not None
        token = self._token.tolist()
        top_ids: list[list[int]] = [[]] * len(token)
        top_values: list[list[float]] = [[]] * len(token)
        if self._top is not None:
            top_values, top_ids = self._top[0].tolist(), self._top[1].tolist()
        for i, (scores, p) in enumerate(zip(self.scores, self.positions, strict=True)):
            k = scores.k
            top = list(zip(top_ids[i][:k], top_values[i][:k], strict=True))
            scores.fill(p, [(self.targets[i], token[i]), *top])
