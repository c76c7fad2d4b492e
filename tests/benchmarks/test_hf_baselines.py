"""benchmarks/hf_baselines.py: the GPU check's verdict on an engine's greedy tokens against transformers."""

from __future__ import annotations

from pathlib import Path

import torch

from benchmarks import hf_baselines


def test_equal_tokens_agree_and_a_wrong_token_does_not(tiny_model):
    net = hf_baselines.load(Path(tiny_model), torch.float32, "cpu")
    prompt = [5, 17, 99, 3, 42]
    ref = hf_baselines.greedy(net, prompt, 6)
    assert len(ref) == 6
    assert hf_baselines.agrees(net, prompt, ref, ref) == {
        "exact": True,
        "agrees": True,
        "first_difference": None,
    }
    with torch.no_grad():
        logits = net(torch.tensor([prompt + ref[:2]])).logits[0, -1]
    wrong = ref[:2] + [int(logits.argmin())] + ref[3:]  # the least likely token at position 2
    assert hf_baselines.agrees(net, prompt, wrong, ref) == {
        "exact": False,
        "agrees": False,
        "first_difference": 2,
    }
    assert hf_baselines.agrees(net, prompt, ref[:4], ref)["agrees"] is False  # too few tokens


def test_a_bf16_tie_is_a_few_units_in_the_last_place():
    assert hf_baselines.tie_margin(16.0) == 0.25
    assert hf_baselines.tie_margin(0.0) == 1e-4
