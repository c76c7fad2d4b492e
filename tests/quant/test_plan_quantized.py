"""`conveyor plan --quantization`: weight bytes as the quantized kernels store them."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from engine.capacity_plan import plan
from engine.model_loader import load_model
from engine.quant import weight_bytes
from engine.quant.memory import linear_bytes
from tests.helpers.gguf_writer import write_gguf
from worker.cli.main import main


@pytest.mark.parametrize("mode", ["none", "int8", "int4"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_plan_counts_what_the_loaded_model_holds(tiny_model_dir, mode, dtype):
    path = tiny_model_dir("llama")
    net, _ = load_model(path, dtype=dtype, quantization=mode)
    assert plan(path, 2**30, dtype=dtype, quantization=mode).weight_bytes == weight_bytes(net)


def test_fp8_counts_one_byte_a_weight_and_float32_scales():
    assert linear_bytes(64, 128, "fp8", 2) == 64 * 128 + 64 * 4
    assert linear_bytes(64, 128, "int4", 2) == 64 * 64 + 4 * 64 * 2 * 2


def test_less_weight_leaves_more_kv_blocks(tiny_model_dir):
    path = tiny_model_dir("llama")
    plain, int4 = (plan(path, 2**23, dtype="float32", quantization=q) for q in ("none", "int4"))
    assert int4.weight_bytes < plain.weight_bytes and int4.num_blocks > plain.num_blocks


def test_cli_option_and_refusals(tiny_model_dir):
    path = str(tiny_model_dir("llama"))
    out = CliRunner().invoke(main, ["plan", "--model", path, "--memory", "1GiB", "--quantization", "int4"])
    assert out.exit_code == 0, out.output
    assert "int4 projections, the rest bfloat16: weights" in out.output
    with pytest.raises(ValueError, match="quantization must be one of none, int8, int4, fp8"):
        plan(path, 2**30, quantization="auto")
    out = CliRunner().invoke(
        main, ["plan", "--model", str(tiny_model_dir("gemma2")), "--memory", "1GiB", "--quantization", "int8"]
    )
    assert out.exit_code != 0 and "native (Llama-family) models only" in out.output


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_1", "F16"])
@pytest.mark.parametrize("tied", [True, False])
def test_plan_counts_a_gguf_files_head_on_the_int4_kernel(tiny_model_dir, tmp_path, monkeypatch, qtype, tied):
    # int4 serves a GGUF file's head from its blocks (Q8_0 as a pair of int4 halves, Q4_1 as int4, F16 as
    # loaded): the plan counts what the loaded model holds.
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))
    gguf = write_gguf(tiny_model_dir("llama", tie_word_embeddings=tied), tmp_path / "m.gguf", qtype)
    net, _ = load_model(gguf, dtype="bfloat16", quantization="int4")
    assert (net.lm_head.weight is not None) if qtype == "F16" else not hasattr(net.lm_head, "weight")
    assert plan(gguf, 2**30, dtype="bfloat16", quantization="int4").weight_bytes == weight_bytes(net)
