"""The sampler's device path: every step on the device, one device-to-host copy at the end.

Chosen once, when the sampler is built (`make_sampler`): CUDA gets this, the CPU keeps `engine.sampler.Sampler`
(block top-k, candidate-only noise and numpy argmax, written for the host). Here nothing reads a tensor back
before the sampled ids: no `.item()`, `bool(tensor)`, `.tolist()`, `.cpu()`, `.numpy()`, no boolean-mask
indexing or `nonzero` (each a sync on CUDA). Decisions that depend on the batch use the host's parameter
arrays (`BatchParams`), and host data goes to the device by plain host-to-device copies.

Per step, for logits [B, V_padded] (row i is requests[i]):
  raw logprobs (when asked) = log_softmax of the raw logits [B, V]
  penalties on a copy: repetition (prompt + output, x / r or x * r), presence and frequency (output counts),
  min_tokens bans (-inf); greedy rows: argmax
  random rows: sort each row descending (ties by ascending id), w = exp((x - max) / T), then min_p, top_k
  (position >= k), top_p (kept mass strictly before > top_p x kept mass) cut w to 0, and the token is
  argmax(w / q) with q = Exp(1) noise of (row seed, token id) (`device_noise`, the host path's hash); rows
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

from engine.outputs import TokenLogprobs
from engine.request_state import SamplingRequest as Request
from engine.sampler import SampledIds, SamplerResult, vocab_logits
from engine.sampling.batch_params import BatchParams, output_lengths
from engine.sampling.device_noise import exponential_noise, row_uniforms
from engine.sampling.host_to_device import to_device
from engine.sampling.inverse_cdf import sample_by_uniform
from engine.sampling.noise import stable_seeds
from engine.sampling.penalties import min_tokens_banned


class DeviceSampler:
    """TokenSampler for CUDA (any device: the tests run it on CPU tensors)."""

    def __init__(self, vocab_size: int, eos_token_ids: frozenset[int]) -> None:
        self.vocab_size = vocab_size
        self.eos_token_ids = frozenset(eos_token_ids)
        self._params: BatchParams | None = None

    def batch_params(self, requests: list[Request]) -> BatchParams:
        self._params = BatchParams.reuse(self._params, requests, self.vocab_size)
        return self._params

    def __call__(self, logits: torch.Tensor, requests: list[Request]) -> SamplerResult:
        return self.launch(logits, requests).read()

    def launch(self, logits: torch.Tensor, requests: list[Request]) -> SampledIds:
        """Queue the step's sampling; nothing is read back until `read()` on the result."""
        logits = vocab_logits(logits, len(requests), self.vocab_size).float()  # [B, V]
        bp = self.batch_params(requests)
        pending = bp.min_tokens_pending()
        if bp.plain_greedy and not pending:
            tokens = logits.argmax(dim=-1)  # [B] int64
        else:
            work = self._penalised(logits, bp, pending)
            tokens = work.argmax(dim=-1)  # [B] int64
            if not bool(bp.greedy.all()):  # host array
                sampled = self._sample(work, bp)
                greedy = to_device(bp.greedy, logits.device)
                tokens = torch.where(greedy, tokens, sampled)
        host = _to_host(self._read_back_rows(logits, tokens, requests, bp))
        return SampledIds(tokens, lambda: self._unpack(host(), requests, bp))

    def _penalised(self, logits: torch.Tensor, bp: BatchParams, pending: list[int]) -> torch.Tensor:
        """[B, V] float32: logits with the penalties and min_tokens bans, a copy when there are any."""
        dev, vocab, requests = logits.device, self.vocab_size, bp.requests
        work = logits
        if bp.rep_rows:
            rows = bp.rep_rows
            seen = _token_mask([requests[i].token_ids() for i in rows], rows, len(requests), vocab, dev)
            rep = to_device(bp.repetition, dev)[:, None]  # [B, 1]
            work = torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits)
        if bp.dense:
            pres = [r.params.presence_penalty for r in requests]
            freq = [r.params.frequency_penalty for r in requests]
            counts = _token_counts([r.output_token_ids for r in requests], len(requests), vocab, dev)
            p = to_device(pres, dev, torch.float32)[:, None]
            f = to_device(freq, dev, torch.float32)[:, None]
            work = work - (f * counts + p * (counts > 0).float())
        pairs = [
            i * vocab + t
            for i in pending
            for t in min_tokens_banned(requests[i], self.eos_token_ids)
            if t < vocab
        ]
        if pairs:
            work = work.clone() if work is logits else work
            flat = to_device(pairs, dev, torch.int64)
            work.view(-1).index_fill_(0, flat, -float("inf"))
        return work

    def _sample(self, work: torch.Tensor, bp: BatchParams) -> torch.Tensor:
        """[B] int64: the race (or the inverse transform) of every row; greedy rows' values unused."""
        dev, vocab = work.device, work.shape[1]
        seeds = self._row_seeds(bp, dev)  # [B] int64
        t = to_device(np.where(bp.greedy, 1.0, bp.temperature).astype(np.float32), dev)[:, None]
        mp = to_device(bp.min_p, dev)[:, None]
        tp = to_device(bp.top_p, dev)[:, None]
        k = to_device(bp.top_k, dev)[:, None]
        values, ids = work.sort(dim=-1, descending=True, stable=True)  # [B, V]
        w = torch.exp((values - values[:, :1]) / t)  # [B, V], the max is 1
        if (bp.min_p > 0).any():
            w = torch.where(w < mp, 0.0, w)
        w = torch.where(torch.arange(vocab, device=dev)[None, :] >= k, 0.0, w)
        if (bp.top_p < 1.0).any():
            before = w.cumsum(dim=-1) - w
            total = w.sum(dim=-1, keepdim=True)
            w = torch.where((before > tp * total) & (tp < 1.0), 0.0, w)
        choice = (w / exponential_noise(seeds, ids)).argmax(dim=-1, keepdim=True)  # [B, 1]
        tokens = ids.gather(1, choice)[:, 0]  # [B]
        every = ~bp.greedy & (bp.top_k >= vocab) & (bp.top_p >= 1.0)  # host: every token a candidate
        if every.any():
            x = torch.exp((work - work.amax(dim=-1, keepdim=True)) / t)  # [B, V], vocabulary order
            if (bp.min_p > 0).any():
                x = torch.where(x < mp, 0.0, x)
            by_cdf = sample_by_uniform(x, row_uniforms(seeds))
            tokens = torch.where(to_device(every, dev), by_cdf, tokens)
        return tokens

    def _row_seeds(self, bp: BatchParams, dev: torch.device) -> torch.Tensor:
        """[B] int64 row seeds: the stable hash for seeded rows (host arrays), a device draw for the others."""
        stable = stable_seeds(bp.seed, bp.sample_index, output_lengths(bp.requests)).view(np.int64)
        seeds = to_device(stable, dev)
        if not bp.seeded.all():
            draws = torch.randint(0, 2**63 - 1, seeds.shape, dtype=torch.int64, device=dev)
            seeds = torch.where(to_device(bp.seeded, dev), seeds, draws)
        return seeds

    def _read_back_rows(
        self, logits: torch.Tensor, tokens: torch.Tensor, requests: list[Request], bp: BatchParams
    ) -> torch.Tensor:
        """What the host reads: [B] int64 ids, or with logprobs [B, 2 + 2 k] float64 (id, its logprob,
        the top-k ids, their logprobs) of the raw logits."""
        if not bp.logprobs:
            return tokens
        raw = torch.log_softmax(logits, dim=-1)  # [B, V] of the raw logits
        max_k = min(max(r.params.logprobs or 0 for r in requests), raw.shape[1])
        parts = [tokens[:, None].double(), raw.gather(1, tokens[:, None]).double()]
        if max_k > 0:
            top = raw.topk(max_k, dim=-1)
            parts += [top.indices.double(), top.values.double()]
        return torch.cat(parts, dim=1)

    @staticmethod
    def _unpack(host: list, requests: list[Request], bp: BatchParams) -> SamplerResult:
        if not bp.logprobs:
            return SamplerResult(host, [None] * len(requests))
        max_k = (len(host[0]) - 2) // 2 if host else 0
        token_ids = [int(row[0]) for row in host]
        out: list[TokenLogprobs | None] = []
        for row, r in zip(host, requests, strict=True):
            n = r.params.logprobs
            if n is None:
                out.append(None)
                continue
            top_ids, top_lp = row[2 : 2 + max_k], row[2 + max_k :]
            out.append(
                [(int(row[0]), row[1])] + [(int(i), v) for i, v in zip(top_ids[:n], top_lp[:n], strict=True)]
            )
        return SamplerResult(token_ids, out)


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


def _token_mask(
    rows_tokens: list[list[int]], rows: list[int], batch: int, vocab: int, dev: torch.device
) -> torch.Tensor:
    """[B, V] bool: True at (rows[j], t) for each t in rows_tokens[j] (ids outside [0, V) ignored)."""
    flat = [r * vocab + t for r, ts in zip(rows, rows_tokens, strict=True) for t in ts if 0 <= t < vocab]
    mask = torch.zeros(batch * vocab, dtype=torch.bool, device=dev)
    mask.index_fill_(0, to_device(flat, dev, torch.int64), True)
    return mask.view(batch, vocab)


def _token_counts(rows_tokens: list[list[int]], batch: int, vocab: int, dev: torch.device) -> torch.Tensor:
    """[B, V] float32 counts of each row's tokens (ids outside [0, V) ignored)."""
    flat = [r * vocab + t for r, ts in enumerate(rows_tokens) for t in ts if 0 <= t < vocab]
    counts = torch.zeros(batch * vocab, dtype=torch.float32, device=dev)
    index = to_device(flat, dev, torch.int64)
    counts.index_add_(0, index, torch.ones(len(flat), dtype=torch.float32, device=dev))
    return counts.view(batch, vocab)
