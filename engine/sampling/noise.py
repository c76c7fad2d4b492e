"""The sampler's randomness, one implementation for the host and the device: reproducible per
(seed, sample_index, position, token).

Sampling `argmax(probs / q)` with q_t ~ Exp(1) i.i.d. picks token t with probability probs_t / sum(probs)
(the Gumbel-max trick in another form), so the randomness is one noise value per candidate token. The
value for token t of a row is a counter-based hash of (row seed, t): `splitmix64` of the two, turned into
a uniform u in (0, 1) and q = -log(u). So a row only needs noise for its candidates, and the noise of a
token does not depend on which other tokens are candidates. Rows whose candidates are every token draw
by inverse transform instead, from one uniform per row (`row_uniforms`, another stream of the same seed).

A seeded request's row seed is a stable hash of (seed, sample_index, position), position =
len(output_token_ids): the token does not depend on the batch it shares, on the order of rows, on the
device or on which worker runs it, so a resumed request continues identically. Unseeded rows draw their
row seed from torch's generator (on the device that samples).

Everything is int64 torch ops, which run wherever the tensors are: int64 stands in for uint64, since
multiplication and xor wrap the same way in two's complement; a right shift is arithmetic on int64, so the
sign bits it brings in are masked off (`_shr`). Seeds: int64 tensors holding the uint64 bits.
"""

from __future__ import annotations

import numpy as np
import torch


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
# Mixed into the row seed so that a row's uniform is not the race's noise of token 0.
_STREAM = _signed(0x2545F4914F6CDD1D)
_MAX_SEED = 2**63 - 1


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """x: int64 (any shape, uint64 bits) -> int64, the splitmix64 finaliser of each value."""
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def as_seeds(x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """Seeds as int64 bits: a tensor as it is, a numpy array (any integer dtype, values >= 0) converted."""
    if isinstance(x, torch.Tensor):
        return x
    return torch.from_numpy(np.ascontiguousarray(x).astype(np.uint64).view(np.int64))


def stable_seeds(seed: np.ndarray, sample_index: np.ndarray, position: np.ndarray) -> torch.Tensor:
    """[R] int64 63-bit row seeds from [R] arrays of the three ints (any integer dtype, values >= 0);
    a fixed function, independent of PYTHONHASHSEED, process, device and batch."""
    h = splitmix64(as_seeds(seed))
    h = splitmix64(h ^ as_seeds(sample_index))
    h = splitmix64(h ^ as_seeds(position))
    return h & _MAX_SEED


def stable_seed(seed: int, sample_index: int, position: int) -> int:
    """The row seed of one (seed, sample_index, position): `stable_seeds` of one row."""
    one = [np.array([v], dtype=np.uint64) for v in (seed, sample_index, position)]
    return int(stable_seeds(*one)[0])


def row_seeds(
    seeds: np.ndarray,
    seeded: np.ndarray,
    sample_index: np.ndarray,
    position: np.ndarray,
    device: torch.device | None = None,
) -> torch.Tensor:
    """[R] int64 row seeds on `device` (default the host): the stable seed of each seeded row (seeded [R]
    bool host array; seeds [R], any value where not seeded), a draw from the device's generator for the
    others. The hash runs on the host (host data only); the draws where the seeds end up."""
    out = stable_seeds(seeds, sample_index, position)
    if device is not None and device.type != "cpu":
        out = out.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else out.to(device)
    if not seeded.all():
        draws = torch.randint(0, _MAX_SEED, out.shape, dtype=torch.int64, device=out.device)
        if not seeded.any():
            return draws
        out = torch.where(torch.from_numpy(seeded).to(out.device), out, draws)
    return out


def exponential_noise(seeds: torch.Tensor | np.ndarray, token_ids: torch.Tensor) -> torch.Tensor:
    """seeds: [R] row seeds (`as_seeds`); token_ids: [R, K] int64 -> q [R, K] float32 Exp(1), on
    token_ids' device. The value depends only on (seeds[r], token_ids[r, k])."""
    seeds = as_seeds(seeds).to(token_ids.device)
    bits = splitmix64(splitmix64(seeds[:, None]) ^ (token_ids * _GOLDEN))
    # The top 53 bits as u in (0, 1]: never 0, so q > 0 and probs / q is finite.
    u = (_shr(bits, 11).to(torch.float64) + 1.0) * (1.0 / 2**53)
    return (-torch.log(u)).float()


def row_uniforms(seeds: torch.Tensor | np.ndarray) -> torch.Tensor:
    """seeds: [R] (`as_seeds`) -> [R] float64 uniforms in [0, 1) (the top 53 bits of another splitmix64
    stream), where the seeds are."""
    return _shr(splitmix64(as_seeds(seeds) ^ _STREAM), 11).to(torch.float64) * (1.0 / 2**53)
