"""Device, attention backend and EOS ids are resolved once, when the engine is built, and every part that
needs one gets that same value passed down."""

from __future__ import annotations

import json

import torch

from engine import LLMEngine


def test_one_device_backend_and_eos_set_for_every_part(tiny_model_dir, tmp_path):
    src = tiny_model_dir("llama")
    model = tmp_path / "model"
    model.mkdir()
    for f in src.iterdir():
        (model / f.name).write_bytes(f.read_bytes())
    # An extra EOS only generation_config.json names (like Llama 3's <|eot_id|>).
    gen = json.loads((model / "generation_config.json").read_text())
    tokenizer_eos = json.loads((model / "config.json").read_text())["eos_token_id"]
    gen["eos_token_id"] = [tokenizer_eos, 7]
    (model / "generation_config.json").write_text(json.dumps(gen))

    llm = LLMEngine(str(model), num_kv_blocks=8, device="auto", attention_backend="auto")
    assert llm.device == torch.device("cpu") and llm.runner.device == llm.device
    assert llm.runner.kv_pool.device.type == "cpu"
    assert llm.model.attn_backend is llm.attention_backend and llm.attention_backend.name == "torch"
    assert llm.eos_token_ids == {tokenizer_eos, 7, llm.tokenizer.eos_token_id}
    assert llm.scheduler.eos_token_ids == llm.eos_token_ids
    assert llm.runner.sampler.eos_token_ids == llm.eos_token_ids
