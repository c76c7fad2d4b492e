"""The `quantization` engine option end to end: LLMEngine kwargs, the worker's --quantization, refusals."""

from __future__ import annotations

import pytest
import torch
from click.testing import CliRunner
from structlog.testing import capture_logs

from engine import LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.model_loader import load_model
from engine.quant import weight_bytes
from engine.quant.linear import QuantLinear
from tests.helpers.gguf_writer import write_gguf
from worker.cli.main import main


@pytest.mark.parametrize("mode,dtype", [("int8", "float32"), ("int4", "float32"), ("int4", "bfloat16")])
def test_engine_generates_with_quantized_weights(tiny_model, mode, dtype):
    llm = LLMEngine(tiny_model, quantization=mode, dtype=dtype, num_kv_blocks=64)
    try:
        assert isinstance(llm.model.layers[0].mlp.down_proj, QuantLinear)
        out = llm.generate(["Hello there", "a b c"], SamplingParams(max_tokens=6, temperature=0))
        assert [len(o.outputs[0].token_ids) for o in out] == [6, 6]
    finally:
        llm.close()


def test_fp8_on_the_cpu_is_refused_before_loading(tmp_path):
    # No checkpoint at all: the refusal comes before anything is read.
    with pytest.raises(ValueError, match="fp8 needs a CUDA GPU of compute capability 8.9"):
        LLMEngine(str(tmp_path / "nothing"), quantization="fp8", num_kv_blocks=64)


def test_unknown_mode_is_refused_by_the_config():
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8, int4, fp8"):
        EngineConfig(model="x", quantization="int3")


def test_worker_has_the_option():
    out = CliRunner().invoke(main, ["worker", "--help"]).output
    assert "--quantization [auto|none|int8|int4|fp8]" in out


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["int8", "int4", "fp8"])
def test_engine_on_cuda(tiny_model, mode):
    if mode == "fp8" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("fp8 needs sm_89+")
    llm = LLMEngine(tiny_model, quantization=mode, dtype="bfloat16", device="cuda", num_kv_blocks=64)
    try:
        out = llm.generate(["Hello there"], SamplingParams(max_tokens=6, temperature=0))
        assert len(out[0].outputs[0].token_ids) == 6
    finally:
        llm.close()


@pytest.mark.parametrize("dtype,warned", [("float32", True), ("bfloat16", False)])
def test_load_log_says_what_the_weights_take(tiny_model_dir, dtype, warned):
    with capture_logs() as logs:
        load_model(tiny_model_dir("llama"), dtype=dtype, quantization="int4")
    (loaded,) = [e for e in logs if e["event"] == "weights loaded"]
    assert loaded["linear_layers"] == {"int4 g32": 8} and loaded["weight_bytes"] > 0
    slow = [e for e in logs if e["log_level"] == "warning" and "consider --dtype bfloat16" in e["event"]]
    assert bool(slow) == warned


def test_load_log_names_the_head_served_from_a_gguf_file(tiny_model_dir, tmp_path, monkeypatch):
    monkeypatch.setenv("CONVEYOR_CACHE", str(tmp_path / "cache"))
    gguf = write_gguf(tiny_model_dir("llama", tie_word_embeddings=True), tmp_path / "m.gguf", "Q8_0")
    with capture_logs() as logs:
        net, _ = load_model(gguf, dtype="bfloat16", quantization="int4")
    (loaded,) = [e for e in logs if e["event"] == "weights loaded"]
    assert loaded["lm_head"] == "int4 g32 pair (Q8_0 blocks, exact), the table from 8 rows"
    assert loaded["weight_bytes"] == weight_bytes(net)  # the head's kernel beside the embedding's table
