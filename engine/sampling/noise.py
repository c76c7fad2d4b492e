"""Exponential noise for the exponential-race sampler, reproducible per (seed, sample_index, position).

Sampling `argmax(probs / q)` with q_t ~ Exp(1) i.i.d. picks token t with probability probs_t / sum(probs)
(the Gumbel-max trick in another form), so the randomness is one noise vector per row. For a seeded request
that vector comes from its own `torch.Generator` seeded with a stable hash of (seed, sample_index, position),
position = len(output_token_ids): the token does not depend on the batch it shares, on the order of rows, or on
which worker runs it, so a resumed request continues identically. Unseeded rows use the device's default
generator. The same seed gives the same noise on the same device type and torch version (CPU and CUDA
generators differ).
"""

from __future__ import annotations

import hashlib

import torch

from engine.core.request import Request

# Avoids 0 (then probs / q would be inf or, for a cut token, 0 / 0 = nan, which argmax would pick).
_MIN_NOISE = 1e-20


def stable_seed(seed: int, sample_index: int, position: int) -> int:
    """A 63-bit generator seed from the three ints; independent of PYTHONHASHSEED and process."""
    digest = hashlib.blake2b(f"{seed}:{sample_index}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def exponential_noise(requests: list[Request], vocab_size: int, device: torch.device) -> torch.Tensor:
    """q: [R, V] float32, Exp(1) noise, row i for requests[i]."""
    q = torch.empty(len(requests), vocab_size, dtype=torch.float32, device=device)
    unseeded = [i for i, r in enumerate(requests) if r.params.seed is None]
    if unseeded:
        rows = torch.tensor(unseeded, device=device)
        q[rows] = torch.empty(len(unseeded), vocab_size, dtype=torch.float32, device=device).exponential_()
    for i, r in enumerate(requests):
        if r.params.seed is not None:
            gen = torch.Generator(device=device)
            gen.manual_seed(stable_seed(r.params.seed, r.sample_index, len(r.output_token_ids)))
            q[i].exponential_(generator=gen)
    return q.clamp_min_(_MIN_NOISE)
