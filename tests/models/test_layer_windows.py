"""Per-layer sliding windows read from config.json exactly as transformers' own classes read them, and the
configs the native model cannot run refused at load."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine.model_loader import load_model
from engine.models import ModelArgs, UnsupportedModelError

ARCH = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
}


def _cfg(model_type: str, layers: int = 4, **extra) -> dict:
    return {
        "architectures": [ARCH[model_type]],
        "model_type": model_type,
        "vocab_size": 64,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": layers,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 8,
        **extra,
    }


def _transformers_windows(cfg: dict) -> tuple[int | None, ...]:
    """What transformers' modeling code applies per layer, read off its own modules (built on meta)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**cfg)
    if cfg["model_type"] == "mistral":  # MistralAttention passes config.sliding_window on every layer
        return (config.sliding_window,) * cfg["num_hidden_layers"]
    if cfg["model_type"] == "llama":  # LlamaAttention has no window at all
        return (None,) * cfg["num_hidden_layers"]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    return tuple(layer.self_attn.sliding_window for layer in model.model.layers)


AGREEMENT = {
    "mistral-default": _cfg("mistral"),  # no key: MistralConfig's default 4096
    "mistral-24": _cfg("mistral", sliding_window=24),
    "mistral-null": _cfg("mistral", sliding_window=None),
    "qwen2-off": _cfg("qwen2", sliding_window=24),  # use_sliding_window absent: off
    "qwen2-max-window-layers": _cfg("qwen2", use_sliding_window=True, sliding_window=24, max_window_layers=1),
    "qwen2-default-max-window-layers": _cfg("qwen2", layers=30, use_sliding_window=True, sliding_window=8),
    "qwen2-layer-types": _cfg(
        "qwen2",
        use_sliding_window=True,
        sliding_window=16,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    ),
    "qwen2-layer-types-but-off": _cfg(
        "qwen2", sliding_window=16, layer_types=["sliding_attention", "full_attention"] * 2
    ),
    "qwen3-window": _cfg("qwen3", use_sliding_window=True, sliding_window=12, max_window_layers=2),
    "llama-with-window-key": _cfg("llama", sliding_window=24),
}


@pytest.mark.parametrize("name", list(AGREEMENT))
def test_windows_agree_with_transformers(name):
    cfg = AGREEMENT[name]
    ours = ModelArgs.from_hf(cfg).layer_windows
    assert ours == _transformers_windows(cfg)


def test_expected_windows_spelled_out():
    # The agreement above, for a few cases by hand, so a transformers change cannot move both sides.
    assert ModelArgs.from_hf(AGREEMENT["mistral-default"]).layer_windows == (4096,) * 4
    assert ModelArgs.from_hf(AGREEMENT["qwen2-max-window-layers"]).layer_windows == (None, 24, 24, 24)
    assert ModelArgs.from_hf(AGREEMENT["qwen2-layer-types"]).layer_windows == (16, None, 16, None)
    assert ModelArgs.from_hf(AGREEMENT["qwen2-off"]).layer_windows == (None,) * 4


@pytest.mark.parametrize(
    "cfg,match",
    [
        (
            _cfg("qwen2", use_sliding_window=True, layer_types=["chunked_attention", "full_attention"] * 2),
            r"layer_types \['chunked_attention'\] unsupported by the native qwen2 model",
        ),
        (
            _cfg("qwen3", use_sliding_window=True, layer_types=["full_attention"] * 3),
            "3 entries for 4 layers",
        ),
        (_cfg("mistral", sliding_window=0), "sliding_window must be a positive int"),
        (_cfg("qwen2", use_sliding_window=True, sliding_window=-4), "sliding_window must be a positive int"),
    ],
)
def test_unsupported_window_configs_refused(cfg, match):
    with pytest.raises(UnsupportedModelError, match=match):
        ModelArgs.from_hf(cfg)


def test_loader_refuses_before_serving(tiny_model_dir, tmp_path):
    src = tiny_model_dir("qwen2", sliding_window=16, max_window_layers=1)
    for f in src.iterdir():
        shutil.copy(f, tmp_path / f.name)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["layer_types"] == ["full_attention", "sliding_attention"]  # as make_tiny_model wrote it
    net, _ = load_model(tmp_path)
    assert [layer.self_attn.window for layer in net.layers] == [None, 16]
    cfg["layer_types"] = ["full_attention", "linear_attention"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="linear_attention"):
        load_model(tmp_path)
