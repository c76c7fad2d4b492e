"""The one place a device name ("auto", "cpu", "cuda", "cuda:1") becomes a torch.device."""

from __future__ import annotations

import torch


def resolve_device(name: str | torch.device) -> torch.device:
    if isinstance(name, torch.device):
        return name
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available")
    return device
