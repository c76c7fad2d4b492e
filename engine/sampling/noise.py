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

The stable hash is splitmix64 chained over the three ints, computed for the whole batch in a few numpy
operations (it replaced a blake2b of a formatted string per request per step, ~10 us each: the seeded
streams of that version differ from these, the properties above are the same).
"""

from __future__ import annotations

import numpy as np
import torch

from engine.request_state import SamplingRequest as Request

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def stable_seeds(seed: np.ndarray, sample_index: np.ndarray, position: np.ndarray) -> np.ndarray:
    """[R] uint64 63-bit row seeds from [R] arrays of the three ints (any integer dtype, values >= 0);
    a fixed function, independent of PYTHONHASHSEED, process and batch."""
    with np.errstate(over="ignore"):
        h = splitmix64(seed.astype(np.uint64))
        h = splitmix64(h ^ sample_index.astype(np.uint64))
        h = splitmix64(h ^ position.astype(np.uint64))
    return h & np.uint64(2**63 - 1)


def stable_seed(seed: int, sample_index: int, position: int) -> int:
    """The row seed of one (seed, sample_index, position): `stable_seeds` of one row."""
    one = [np.array([v], dtype=np.uint64) for v in (seed, sample_index, position)]
    return int(stable_seeds(*one)[0])


def row_seeds(
    seeds: np.ndarray, seeded: np.ndarray, sample_index: np.ndarray, position: np.ndarray
) -> np.ndarray:
    """[R] uint64 row seeds: the stable seed of each seeded row (seeded [R] bool; seeds [R] uint64, any value
    where not seeded), a fresh draw from torch's generator for the others."""
    out = stable_seeds(seeds, sample_index, position)
    unseeded = np.flatnonzero(~seeded)
    if len(unseeded):
        draws = torch.randint(0, 2**63 - 1, (len(unseeded),), dtype=torch.int64)
        out[unseeded] = draws.numpy().astype(np.uint64)
    return out


def request_row_seeds(requests: list[Request]) -> np.ndarray:
    """row_seeds for a list of requests (position = len(output_token_ids)); the sampler keeps these arrays
    between steps instead (`engine.sampling.batch_params`)."""
    seeded = np.array([r.params.seed is not None for r in requests], dtype=bool)
    seeds = np.array([r.params.seed or 0 for r in requests], dtype=np.uint64)
    index = np.array([r.sample_index for r in requests], dtype=np.uint64)
    position = np.array([len(r.output_token_ids) for r in requests], dtype=np.uint64)
    return row_seeds(seeds, seeded, index, position)


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
