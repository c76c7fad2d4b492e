"""The one place a device name ("auto", "cpu", "cuda", "cuda:1") becomes a torch.device.

A CUDA device always comes back with an index: `torch.cuda.set_device` (DeviceBinding) rejects an unindexed
`torch.device("cuda")` ("Expected a torch.device with a specified index"), so "cuda" and "auto" name the
current device, as a tensor made with device="cuda" would."""

from __future__ import annotations

import threading

import torch


def resolve_device(name: str | torch.device) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r} asked for, but CUDA is not available")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


class DeviceBinding:
    """Makes `device` the current CUDA device of every thread that runs engine work on it.

    Triton launches on the calling thread's current device (and so does any tensor made with device="cuda"),
    and that is per thread: a model on cuda:1 stepped from a thread still on cuda:0 would launch kernels on
    GPU 0 with pointers into GPU 1. `bind()` costs one thread-id compare once the thread is bound.
    No-op off CUDA."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._threads: set[int] = set()

    def bind(self) -> None:
        if self.device.type != "cuda":
            return
        ident = threading.get_ident()
        if ident not in self._threads:
            torch.cuda.set_device(self.device)
            self._threads.add(ident)
