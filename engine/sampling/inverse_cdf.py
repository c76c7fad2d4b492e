"""Sampling when every token of the vocabulary is a candidate (no top-k, no top-p): one uniform per row.

The exponential race (`engine.sampling.race`) needs one noise value per candidate; over a whole
[256, 32000] vocabulary that hashing costs far more than the step's model work on a CPU. With every token a candidate there
is no candidate set to be independent of, so the token is drawn by inverse transform instead: the cumulative
sum of the row's weights (float64, so the tail keeps its resolution) and one uniform u in [0, 1) per row,
token = the first index whose cumulative weight exceeds u x the row's mass; the sum is taken over blocks and
then inside the chosen block, so one pass reads the row.

u comes from the row seed (`engine.sampling.noise.row_uniforms`), so a seeded request still draws the
same token whatever its batch and device; the stream differs from the race's for the same seed.
"""

from __future__ import annotations

import numpy as np
import torch

from engine.sampling.noise import as_seeds, row_uniforms


def sample_by_cdf(weights: torch.Tensor, seeds: torch.Tensor | np.ndarray, block: int = 64) -> torch.Tensor:
    """weights: [R, V] float32, >= 0, a positive entry per row; seeds: [R] row seeds (`noise.as_seeds`) -> [R] int64
    token ids, token t of row r with probability weights[r, t] / weights[r].sum().

    Two levels, so that only one pass reads the whole row: the cumulative sum of block sums picks the block
    ([R, V / b] float64), then the cumulative sum inside that block picks the token ([R, b])."""
    return sample_by_uniform(weights, row_uniforms(as_seeds(seeds).to(weights.device)), block)


def sample_by_uniform(weights: torch.Tensor, u: torch.Tensor, block: int = 64) -> torch.Tensor:
    """`sample_by_cdf` with the rows' uniforms u [R] float64 in [0, 1) given (host or device): no host read."""
    rows, width = weights.shape
    num_blocks = -(-width // block)
    if num_blocks * block != width:  # pad the last block with zero weights (never drawn)
        weights = torch.nn.functional.pad(weights, (0, num_blocks * block - width))
    blocks = weights.view(rows, num_blocks, block)  # [R, m, b]
    cdf = torch.cumsum(blocks.sum(dim=-1, dtype=torch.float64), dim=-1)  # [R, m]
    u = u.to(cdf.device)  # [R]
    target = (u * cdf[:, -1])[:, None]  # [R, 1], < the row's mass
    # The first block whose cumulative weight exceeds the target: its own weight is > 0.
    b = torch.searchsorted(cdf, target, right=True).clamp(max=num_blocks - 1)  # [R, 1]
    rest = target - torch.where(b > 0, cdf.gather(1, (b - 1).clamp(min=0)), 0.0)  # [R, 1]
    inner = torch.cumsum(blocks[torch.arange(rows, device=cdf.device), b[:, 0]], dim=-1, dtype=torch.float64)
    t = torch.searchsorted(inner, rest, right=True)  # [R, 1]
    # Rounding may put `rest` at or past the block's own sum: take its last token of positive weight.
    last = (inner < inner[:, -1:]).sum(dim=-1, keepdim=True)
    return (b * block + torch.minimum(t, last))[:, 0]
