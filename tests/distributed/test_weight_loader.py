"""The one loading loop (load_parameters) and materialize, on a small module and a real safetensors file:
weight loaders and ties survive materialize, a tied parameter is read once, and what does not fit is named."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

from engine import checkpoint
from engine.checkpoint import Checkpoint
from engine.distributed.group import TPGroup
from engine.distributed.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from engine.distributed.weight_loader import (
    default_weight_loader,
    load_parameters,
    materialize,
    weight_loader_of,
)
from tests.helpers.checkpoint_reads import ReadLog

VOCAB, HIDDEN = 5, 3


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = VocabParallelEmbedding(VOCAB, HIDDEN, TPGroup.single())
        self.norm = nn.LayerNorm(HIDDEN, bias=False)
        self.head = ParallelLMHead(VOCAB, HIDDEN, TPGroup.single())
        self.head.weight = self.embed.weight  # tied


def _tiny() -> Tiny:
    with torch.device("meta"):
        model = Tiny()
    materialize(model, torch.device("cpu"))
    return model


def _place(name: str) -> tuple[str, None]:
    return name, None


def test_materialize_keeps_loaders_and_ties():
    model = _tiny()
    assert model.head.weight is model.embed.weight and model.embed.weight.device.type == "cpu"
    assert weight_loader_of(model.embed.weight) == model.embed.weight_loader
    assert weight_loader_of(model.norm.weight) is default_weight_loader


def test_a_tied_parameter_is_read_once(tmp_path, monkeypatch):
    table, norm = torch.randn(VOCAB, HIDDEN), torch.randn(HIDDEN)
    save_file(
        {"embed.weight": table, "head.weight": table + 1, "norm.weight": norm}, tmp_path / "m.safetensors"
    )
    log = ReadLog()
    monkeypatch.setattr(checkpoint, "safe_open", log.open)
    model = _tiny()
    with Checkpoint(tmp_path) as ckpt:
        used = load_parameters(model, ckpt, _place)
    assert used == {"embed.weight", "head.weight", "norm.weight"}
    assert torch.equal(model.head.weight, table) and torch.equal(model.norm.weight, norm)  # first name wins
    assert sorted(log.reads) == ["embed.weight", "norm.weight"]


def test_missing_misplaced_and_misshapen_tensors_are_named(tmp_path):
    save_file({"embed.weight": torch.zeros(VOCAB, HIDDEN)}, tmp_path / "m.safetensors")
    with (
        Checkpoint(tmp_path) as ckpt,
        pytest.raises(KeyError, match=r"weights missing from .*: norm\.weight"),
    ):
        load_parameters(_tiny(), ckpt, _place)
    save_file(
        {"embed.weight": torch.zeros(VOCAB, HIDDEN), "extra": torch.zeros(1)}, tmp_path / "m.safetensors"
    )
    with Checkpoint(tmp_path) as ckpt, pytest.raises(KeyError, match=r"'extra' has no place in the model"):
        load_parameters(_tiny(), ckpt, _place)
    save_file({"embed.weight": torch.zeros(VOCAB + 1, HIDDEN)}, tmp_path / "m.safetensors")
    with (
        Checkpoint(tmp_path) as ckpt,
        pytest.raises(ValueError, match=r"embed\.weight: checkpoint shape \(6, 3\)"),
    ):
        load_parameters(_tiny(), ckpt, _place)
