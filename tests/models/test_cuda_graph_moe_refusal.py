"""CUDA graphs with a mixture-of-experts model on the transformers path are refused before any capture
(transformers' routing calls nonzero() / tolist(), which a capturing stream forbids)."""

from __future__ import annotations

import pytest
import torch

from engine.model_loader import load_model
from engine.model_runner import ModelRunner
from engine.models.config import UnsupportedModelError
from engine.models.generic.checks import is_mixture_of_experts


@pytest.mark.parametrize("arch", ["mixtral", "qwen3_moe"])
def test_graphs_refused_for_a_generic_moe(tiny_model_dir, arch):
    model, spec = load_model(str(tiny_model_dir(arch)), device="cpu", model_impl="transformers")
    assert is_mixture_of_experts(model.hf.config)
    with pytest.raises(
        UnsupportedModelError, match="enable_cuda_graphs is not supported for mixture-of-experts"
    ):
        ModelRunner(
            model, spec, 8, 16, torch.device("cpu"), max_num_seqs=2, max_model_len=64, enable_cuda_graphs=True
        )


def test_a_dense_generic_model_is_not_moe(tiny_model_dir):
    model, _ = load_model(str(tiny_model_dir("phi3")), device="cpu", model_impl="transformers")
    assert not is_mixture_of_experts(model.hf.config)
