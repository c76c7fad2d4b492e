"""The sampler's device path: every step on the device, one device-to-host copy at the end.

Chosen once, when the sampler is built (`make_sampler`): CUDA gets this, the CPU keeps `host_sampler.Sampler`
(block top-k, candidate-only noise and numpy argmax, written for the host). Here nothing reads a tensor back
before the sampled ids: no `.item()`, `bool(tensor)`, `.tolist()`, `.cpu()`, `.numpy()`, no boolean-mask
indexing or `nonzero` (each a sync on CUDA). Decisions that depend on the batch use the host's parameter
columns (the step's `RowView` of the persistent batch), and host data goes to the device by plain host-to-device copies.

Per step, for logits [B, V_padded] (row i is requests[i]):
  raw logprobs (when asked) = log_softmax of the raw logits [B, V]
  penalties on a copy: repetition (prompt + output, x / r or x * r), presence and frequency (output counts),
  min_tokens bans (-inf); greedy rows: argmax
  random rows: sort each row descending (ties by ascending id), w = exp((x - max) / T), then min_p, top_k
  (position >= k), top_p (kept mass strictly before > top_p x kept mass) cut w to 0, and the token is
  argmax(w / q) with q = Exp(1) noise of (row seed, token id) (`noise`, the host path's code); rows
  with neither top_k nor top_p draw by inverse transform from one uniform of the row seed, as on the host.
  one copy: [B, 1 + 2 (1 + k)] float64 = token id, its logprob, the top-k ids and logprobs.
So a seeded row draws what the CPU path draws whenever the two keep the same candidates (top-p's cut can
differ at float rounding: the host sums the row's mass in vocabulary order, this in sorted order).
Row seeds: the stable hash of (seed, sample_index, position) on the host (host data only), unseeded rows
a draw from the device's generator.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from engine.batch_view import RowView
from engine.host_to_device import to_device
from engine.sampling.interface import (
    RowSampler,
    SampledIds,
    SamplerResult,
    logprob_rows,
    unpack_logprobs,
    vocab_logits,
)
from engine.sampling.inverse_cdf import sample_by_uniform
from engine.sampling.noise import exponential_noise, row_seeds, row_uniforms
from engine.sampling.penalties import apply_bans, apply_penalties


class DeviceSampler(RowSampler):
    """TokenSampler for CUDA (any device: the tests run it on CPU tensors)."""

    def launch(self, logits: torch.Tensor, view: RowView) -> SampledIds:
        """Queue the step's sampling; nothing is read back until `read()` on the result."""
        logits = vocab_logits(logits, len(view), self.vocab_size).float()  # [B, V]
        bans = view.banned()
        if view.plain_greedy and not len(bans[0]):
            tokens = logits.argmax(dim=-1)  # [B] int64
        else:
            work = apply_penalties(logits, view)  # a copy when there are penalties
            if len(bans[0]):
                work = work.clone() if work is logits else work
                apply_bans(work, *bans)
            tokens = work.argmax(dim=-1)  # [B] int64
            if not bool(view.greedy.all()):  # host array
                sampled = self._sample(work, view)
                greedy = to_device(view.greedy, logits.device)
                tokens = torch.where(greedy, tokens, sampled)
        if not view.wants_logprobs:
            host = _to_host(tokens)
            return SampledIds(tokens, lambda: SamplerResult(host(), [None] * len(view)))
        asked = view.logprobs
        rows = _to_host(logprob_rows(logits, tokens, view))
        return SampledIds(tokens, lambda: unpack_logprobs(rows(), asked))

    def _sample(self, work: torch.Tensor, view: RowView) -> torch.Tensor:
        """[B] int64: the race (or the inverse transform) of every row; greedy rows' values unused."""
        dev, vocab = work.device, work.shape[1]
        seeds = row_seeds(*view.seeds_input(), device=dev)  # [B] int64
        greedy, top_k, top_p, min_p = view.greedy, view.top_k, view.top_p, view.min_p
        t = to_device(np.where(greedy, 1.0, view.temperature).astype(np.float32), dev)[:, None]
        mp = to_device(min_p, dev)[:, None]
        tp = to_device(top_p, dev)[:, None]
        k = to_device(top_k, dev)[:, None]
        values, ids = work.sort(dim=-1, descending=True, stable=True)  # [B, V]
        w = torch.exp((values - values[:, :1]) / t)  # [B, V], the max is 1
        if (min_p > 0).any():
            w = torch.where(w < mp, 0.0, w)
        w = torch.where(torch.arange(vocab, device=dev)[None, :] >= k, 0.0, w)
        if (top_p < 1.0).any():
            before = w.cumsum(dim=-1) - w
            total = w.sum(dim=-1, keepdim=True)
            w = torch.where((before > tp * total) & (tp < 1.0), 0.0, w)
        choice = (w / exponential_noise(seeds, ids)).argmax(dim=-1, keepdim=True)  # [B, 1]
        tokens = ids.gather(1, choice)[:, 0]  # [B]
        every = ~greedy & (top_k >= vocab) & (top_p >= 1.0)  # host: every token a candidate
        if every.any():
            x = torch.exp((work - work.amax(dim=-1, keepdim=True)) / t)  # [B, V], vocabulary order
            if (min_p > 0).any():
                x = torch.where(x < mp, 0.0, x)
            by_cdf = sample_by_uniform(x, row_uniforms(seeds))
            tokens = torch.where(to_device(every, dev), by_cdf, tokens)
        return tokens


def _to_host(x: torch.Tensor) -> Callable[[], list]:
    """Start the copy of `x` to the host; the returned call waits for it and gives its values as lists.
    On CUDA a non-blocking copy into pinned memory and an event: the host waits only when it reads."""
    if x.device.type != "cuda":
        return x.tolist
    pinned = torch.empty(x.shape, dtype=x.dtype, pin_memory=True)
    pinned.copy_(x, non_blocking=True)
    done = torch.cuda.Event()
    done.record()

    def read() -> list:
        done.synchronize()
        return pinned.tolist()

    return read
