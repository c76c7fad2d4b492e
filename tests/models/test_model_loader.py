"""Loader errors and extras: unsupported architectures, missing weights, sharded checkpoints, eos ids, dtype."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.model_loader import load_model
from engine.models import UnsupportedModelError
from engine.tokenizer import encode_chat, eos_token_ids, load_tokenizer, render_chat


def _copy(src, dst):
    for f in src.iterdir():
        shutil.copy(f, dst / f.name)
    return dst


def test_unsupported_architecture_names_the_supported_ones(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("llama"), tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(UnsupportedModelError, match="GPT2LMHeadModel.*LlamaForCausalLM.*Qwen3ForCausalLM"):
        load_model(d, model_impl="native")


def test_generic_path_refuses_weights_that_do_not_match(tiny_model_dir, tmp_path):
    # Llama weights under a GPT-2 config: transformers would fill GPT-2's weights at random and carry on.
    d = _copy(tiny_model_dir("llama"), tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"], cfg["model_type"] = ["GPT2LMHeadModel"], "gpt2"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(
        KeyError, match=r"checkpoint does not match GPT2LMHeadModel \(missing_keys: transformer\.h\.0"
    ):
        load_model(d)


def test_missing_weight_is_named(tiny_model_dir, tmp_path):
    d = _copy(tiny_model_dir("llama"), tmp_path)
    tensors = load_file(d / "model.safetensors")
    del tensors["model.layers.1.self_attn.k_proj.weight"]
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(KeyError, match=r"layers\.1\.self_attn\.qkv_proj\.weight\[k\]"):
        load_model(d)


def test_sharded_checkpoint_loads_the_same(tiny_model_dir, tmp_path):
    src = tiny_model_dir("qwen2")
    d = _copy(src, tmp_path)
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, d / file, metadata={"format": "pt"})
    weight_map = {k: f for f, keys in shards.items() for k in keys}
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    a, _ = load_model(src)
    b, _ = load_model(d)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_spec_and_dtype(tiny_model_dir):
    model, spec = load_model(tiny_model_dir("qwen3"), dtype="bfloat16")
    assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.hidden_size) == (
        2,
        4,
        2,
        32,
        64,
    )
    assert spec.dtype == torch.bfloat16 and model.lm_head.weight.dtype == torch.bfloat16
    assert spec.eos_token_ids == frozenset({1})
    _, spec32 = load_model(tiny_model_dir("qwen3"))  # "auto" on the CPU is float32
    assert spec32.dtype == torch.float32


def test_tied_embeddings_share_storage(tiny_model_dir):
    model, _ = load_model(tiny_model_dir("llama", tie_word_embeddings=True))
    assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()


def test_not_a_folder_offline_gives_clear_error():
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        load_model("no-such-org/no-such-model-xyz")


def test_hub_id_loads_what_huggingface_hub_fetched(tiny_model_dir, monkeypatch):
    # No hub here: snapshot_download stands in, returning a checkpoint folder as it would after a download.
    import huggingface_hub  # a dependency of transformers

    folder = tiny_model_dir("qwen2")
    asked = []

    def fake_download(repo_id, allow_patterns):
        asked.append((repo_id, allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_download)
    model, spec = load_model("some-org/some-model")
    direct, _ = load_model(folder)
    assert asked[0][0] == "some-org/some-model" and "*.safetensors" in asked[0][1]
    assert spec.num_layers == len(model.layers)
    ours, theirs = model.state_dict(), direct.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in ours)


def test_tokenizer_roundtrip_eos_and_chat(tiny_model_dir):
    d = tiny_model_dir("llama")
    tok = load_tokenizer(d)
    assert len(tok) == 512
    text = "The quick brown fox jumps over the lazy dog."
    ids = tok.encode(text)
    assert ids[0] == tok.bos_token_id and len(ids) < len(text) * 0.6  # merges exist
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert eos_token_ids(tok) == frozenset({tok.eos_token_id})
    assert eos_token_ids(tok, (7, tok.eos_token_id)) == frozenset({7, tok.eos_token_id})
    chat = render_chat(tok, [{"role": "user", "content": "hi"}])
    assert chat == "<|bos|>user\nhi<|eos|>\n<|bos|>assistant\n"
    assert encode_chat(tok, [{"role": "user", "content": "hi"}]).count(tok.bos_token_id) == 2
