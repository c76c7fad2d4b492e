"""Which sampler a runner gets: chosen once, from the device, when the runner is built (not per call).

cpu:        engine.sampling.host_sampler.Sampler, written for the host (block top-k, numpy argmax, noise
            for the candidates only, sparse in-place penalty edits)
otherwise:  engine.sampling.device_sampler.DeviceSampler: every step on the device, one
            device-to-host copy per step
Both read the step's rows of the persistent batch and share the noise and counting code.
"""

from __future__ import annotations

import torch

from engine.sampling.device_sampler import DeviceSampler
from engine.sampling.host_sampler import Sampler
from engine.sampling.interface import TokenSampler


def make_sampler(vocab_size: int, eos_token_ids: frozenset[int], device: torch.device) -> TokenSampler:
    if torch.device(device).type == "cpu":
        return Sampler(vocab_size, eos_token_ids)
    return DeviceSampler(vocab_size, eos_token_ids)
