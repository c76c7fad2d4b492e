"""`engine.sampling.noise` and `inverse_cdf.row_uniforms` computed on the device with integer torch ops.

The same splitmix64 over the same (row seed, token id), so a seeded row's draws are bit-identical to the
host path's: the device sampler picks the token the CPU sampler picks whenever their candidates agree.
int64 stands in for uint64: multiplication and xor wrap the same way in two's complement; a right shift
is arithmetic on int64, so the sign bits it brings in are masked off (`_shr`).
"""

from __future__ import annotations

import torch


def _signed(x: int) -> int:
    return x - (1 << 64) if x >= 1 << 63 else x


_GOLDEN = _signed(0x9E3779B97F4A7C15)
_MIX1 = _signed(0xBF58476D1CE4E5B9)
_MIX2 = _signed(0x94D049BB133111EB)
_STREAM = _signed(0x2545F4914F6CDD1D)  # engine.sampling.inverse_cdf._STREAM


def _shr(x: torch.Tensor, s: int) -> torch.Tensor:
    """Logical right shift of int64 bits."""
    return (x >> s) & ((1 << (64 - s)) - 1)


def splitmix64(x: torch.Tensor) -> torch.Tensor:
    """x: int64 (any shape, uint64 bits) -> int64, the bits of `noise.splitmix64`."""
    x = x + _GOLDEN
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def exponential_noise(seeds: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
    """seeds: [R] int64 row seeds; token_ids: [R, K] int64 -> q [R, K] float32 Exp(1), equal to
    `noise.exponential_noise` of the same values."""
    bits = splitmix64(splitmix64(seeds[:, None]) ^ (token_ids * _GOLDEN))
    u = (_shr(bits, 11).to(torch.float64) + 1.0) * (1.0 / 2**53)  # (0, 1]
    return (-torch.log(u)).float()


def row_uniforms(seeds: torch.Tensor) -> torch.Tensor:
    """seeds: [R] int64 -> [R] float64 in [0, 1), equal to `inverse_cdf.row_uniforms`."""
    return _shr(splitmix64(seeds ^ _STREAM), 11).to(torch.float64) * (1.0 / 2**53)
