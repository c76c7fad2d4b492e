"""The samplers' one noise implementation (int64 torch ops, host and device alike) gives the bits of the
uint64 splitmix64 it is defined by, so seeded streams are the same on every device and did not change
when the host's numpy copy of it was removed."""

from __future__ import annotations

import numpy as np
import torch

from engine.sampling import noise

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_STREAM = np.uint64(0x2545F4914F6CDD1D)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """The reference: uint64 numpy, wrapping."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _MIX1
        x = (x ^ (x >> np.uint64(27))) * _MIX2
        return x ^ (x >> np.uint64(31))


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.numpy().view(np.uint64)


def test_noise_is_uint64_splitmix64_bit_for_bit():
    g = np.random.default_rng(1)
    seeds = g.integers(0, 2**63 - 1, 16, dtype=np.int64).astype(np.uint64)
    ids = g.integers(0, 200_000, (16, 50)).astype(np.uint64)
    with np.errstate(over="ignore"):
        bits = _splitmix64(_splitmix64(seeds[:, None]) ^ (ids * _GOLDEN))
        u = ((bits >> np.uint64(11)).astype(np.float64) + 1.0) * (1.0 / 2**53)
        uniforms = (_splitmix64(seeds ^ _STREAM) >> np.uint64(11)).astype(np.float64) * (1.0 / 2**53)
    seeds_t = noise.as_seeds(seeds)
    got = noise.exponential_noise(seeds_t, torch.from_numpy(ids.view(np.int64)))
    assert torch.equal(got, torch.from_numpy(-np.log(u)).float())
    assert np.array_equal(noise.row_uniforms(seeds_t).numpy(), uniforms)


def test_stable_seeds_chain_the_three_ints():
    seed, index, position = (np.array([v], dtype=np.uint64) for v in (7, 2, 40))
    with np.errstate(over="ignore"):
        h = _splitmix64(_splitmix64(_splitmix64(seed) ^ index) ^ position) & np.uint64(2**63 - 1)
    assert _bits(noise.stable_seeds(seed, index, position)).tolist() == h.tolist()
    assert noise.stable_seed(7, 2, 40) == int(h[0])


def test_unseeded_rows_draw_and_seeded_rows_keep_their_seed():
    seeded = np.array([True, False, True])
    out = noise.row_seeds(np.array([5, 0, 6]), seeded, np.zeros(3), np.array([1, 1, 2]))
    assert out[0].item() == noise.stable_seed(5, 0, 1) and out[2].item() == noise.stable_seed(6, 0, 2)
    assert 0 <= out[1].item() < 2**63
