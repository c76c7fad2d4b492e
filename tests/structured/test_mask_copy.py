"""The grammar bitmask reaches the logits' device through pinned memory, without a blocking copy."""

from __future__ import annotations

import torch

from engine import host_to_device
from engine.structured import batch_mask


class AllowAll:
    """Stands in for an xgrammar GrammarMatcher: leaves its row of the bitmask as allocated (all allowed)."""

    def fill_next_token_bitmask(self, bitmask: torch.Tensor, row: int) -> None:
        pass


def test_the_bitmask_goes_through_the_pinned_copy(monkeypatch):
    copies: list[tuple[torch.Tensor, torch.device]] = []

    def spy(t: torch.Tensor, device: torch.device) -> torch.Tensor:
        copies.append((t, device))
        return t

    monkeypatch.setattr(batch_mask, "to_device", spy)
    logits = torch.zeros(2, 64)
    batch_mask.apply_grammar_masks(logits, [(1, AllowAll())], 64)
    assert len(copies) == 1 and copies[0][1] == logits.device
    assert copies[0][0].dtype == torch.int32 and copies[0][0].shape == (2, 2)  # [B, ceil(64 / 32)]


def test_to_device_pins_then_copies_without_blocking_on_cuda(monkeypatch):
    calls: list[str] = []

    def pin(self: torch.Tensor) -> torch.Tensor:
        calls.append("pin")
        return self

    def to(self: torch.Tensor, device: torch.device, non_blocking: bool = False) -> torch.Tensor:
        calls.append(f"to {device} non_blocking={non_blocking}")
        return self

    monkeypatch.setattr(torch.Tensor, "pin_memory", pin)
    monkeypatch.setattr(torch.Tensor, "to", to)
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    assert host_to_device.to_device(bitmask, torch.device("cuda", 0)) is bitmask
    assert calls == ["pin", "to cuda:0 non_blocking=True"]
