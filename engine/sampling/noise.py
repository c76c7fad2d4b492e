"""Exponential noise for the exponential-race sampler, reproducible per (seed, sample_index, position, token).

Sampling `argmax(probs / q)` with q_t ~ Exp(1) i.i.d. picks token t with probability probs_t / sum(probs)
(the Gumbel-max trick in another form), so the randomness is one noise value per candidate token. The
value for token t of a row is a counter-based hash of (row seed, t): `splitmix64` of the two, turned into
a uniform u in (0, 1) and q = -log(u). So a row only needs noise for its candidates (the 50 tokens top-k
kept, not the whole vocabulary), and the noise of a token does not depend on which other tokens are
candidates. A seeded request's row seed is a stable hash of (seed, sample_index, position), position =
len(output_token_ids): the token does not depend on the batch it shares, on the order of rows, on the
device or on which worker runs it, so a resumed request continues identically. Unseeded rows draw their
row seed from torch's default generator (one draw per step for the whole batch).
"""

from __future__ import annotations

import hashlib

import numpy as np
import torch

from engine.core.request import Request

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def stable_seed(seed: int, sample_index: int, position: int) -> int:
    """A 63-bit row seed from the three ints; independent of PYTHONHASHSEED and process."""
    digest = hashlib.blake2b(f"{seed}:{sample_index}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)


def row_seeds(requests: list[Request]) -> np.ndarray:
    """[R] uint64: the stable seed of each seeded row; a fresh draw from torch's generator for the others."""
    seeds = np.empty(len(requests), dtype=np.uint64)
    unseeded = [i for i, r in enumerate(requests) if r.params.seed is None]
    if unseeded:
        draws = torch.randint(0, 2**63 - 1, (len(unseeded),), dtype=torch.int64)
        seeds[unseeded] = draws.numpy().astype(np.uint64)
    for i, r in enumerate(requests):
        if r.params.seed is not None:
            seeds[i] = stable_seed(r.params.seed, r.sample_index, len(r.output_token_ids))
    return seeds


def splitmix64(x: np.ndarray) -> np.ndarray:
    x = x + _GOLDEN
    x = (x ^ (x >> np.uint64(30))) * _MIX1
    x = (x ^ (x >> np.uint64(27))) * _MIX2
    return x ^ (x >> np.uint64(31))


def exponential_noise(seeds: np.ndarray, token_ids: torch.Tensor) -> torch.Tensor:
    """q: [R, K] float32 Exp(1) noise for `token_ids` [R, K] int64 (on the CPU) of rows with `seeds` [R] uint64.

    The value depends only on (seeds[r], token_ids[r, k]).
    """
    ids = token_ids.numpy().astype(np.uint64)
    with np.errstate(over="ignore"):
        bits = splitmix64(splitmix64(seeds[:, None]) ^ (ids * _GOLDEN))
    # The top 53 bits as u in (0, 1]: never 0, so q > 0 and probs / q is finite.
    u = ((bits >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 2**53)
    return torch.from_numpy(-np.log(u)).float()
