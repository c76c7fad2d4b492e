"""The tools follow windows: `conveyor plan` lists per-layer windows without claiming KV savings (no block
is freed as it slides out), reads an explicit head_dim; `make-tiny-model --sliding-window` writes one."""

from __future__ import annotations

import json

from click.testing import CliRunner

from engine.capacity_plan import format_plan, plan
from worker.cli.main import main

MISTRAL_7B_V01 = {
    "architectures": ["MistralForCausalLM"],
    "model_type": "mistral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "sliding_window": 4096,
}


def test_windowed_plan_claims_no_savings(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(MISTRAL_7B_V01))
    p = plan(tmp_path, 80 * 2**30, dtype="bfloat16", seq_lens=(32768,))
    assert p.layer_windows == (4096,) * 32
    assert p.kv_bytes_per_token == 32 * 2 * 8 * 128 * 2  # every layer, every token: as without windows
    assert p.concurrency[32768] == p.num_blocks // (32768 // 16)
    text = format_plan(p)
    assert "32 of 32 layers (4096 tokens)" in text and "not freed" in text


def test_plan_reads_explicit_head_dim_and_mixed_layer_types(tmp_path):
    # head_dim 128 with 16 heads in a 1024-wide model (Qwen3-style), window on layers 2 and 3 only.
    cfg = {
        **MISTRAL_7B_V01,
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "num_hidden_layers": 4,
        "use_sliding_window": True,
        "sliding_window": 512,
        "max_window_layers": 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    p = plan(tmp_path, 8 * 2**30, dtype="float16")
    assert p.kv_bytes_per_token == 4 * 2 * 4 * 128 * 2
    assert p.layer_windows == (None, None, 512, 512)
    assert "2 of 4 layers (512 tokens)" in format_plan(p)


def test_plan_of_a_family_without_native_support_reads_layer_types(tmp_path):
    cfg = {
        **MISTRAL_7B_V01,
        "architectures": ["Gemma2ForCausalLM"],
        "model_type": "gemma2",
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert plan(tmp_path, 80 * 2**30).layer_windows == (4096, None, 4096, None)


def test_plan_without_windows_says_nothing_about_them(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({**MISTRAL_7B_V01, "sliding_window": None}))
    p = plan(tmp_path, 80 * 2**30)
    assert p.layer_windows == (None,) * 32 and "sliding windows" not in format_plan(p)


def test_make_tiny_model_writes_a_window(tmp_path):
    made = CliRunner().invoke(
        main, ["make-tiny-model", str(tmp_path / "m"), "--arch", "mistral", "--sliding-window", "12"]
    )
    assert made.exit_code == 0, made.output
    assert json.loads((tmp_path / "m" / "config.json").read_text())["sliding_window"] == 12
    bad = CliRunner().invoke(main, ["make-tiny-model", str(tmp_path / "b"), "--sliding-window", "0"])
    assert bad.exit_code != 0 and "--sliding-window" in bad.output
