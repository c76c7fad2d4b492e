"""A GGUF file read through the checkpoint interface: HF names, HF row order, exact values for float types,
row-range reads, raw blocks, and one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from engine.gguf_files.checkpoint import GGUFCheckpoint, check_type
from engine.models.registry import UnsupportedModelError
from tests.gguf_files.conftest import FAMILIES


def _source(folder) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(str(folder / "model.safetensors")).items()}


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_f32_tensors_equal_the_source_weights(tiny_gguf, arch):
    folder, path = tiny_gguf(arch)
    source = _source(folder)
    ckpt = GGUFCheckpoint(path)
    assert set(ckpt.names) == set(source) - (
        {"lm_head.weight"} if ckpt.config["tie_word_embeddings"] else set()
    )
    for name in ckpt.names:
        assert torch.equal(ckpt.slice(name)[:], source[name]), name


def test_f16_tensors_equal_the_source_rounded_to_f16(tiny_gguf):
    folder, path = tiny_gguf("llama", "F16")
    source = _source(folder)
    ckpt = GGUFCheckpoint(path)
    for name in ckpt.names:  # 2-D weights stored in F16, norms in F32
        expected = source[name].half().float() if source[name].dim() == 2 else source[name]
        assert torch.equal(ckpt.slice(name)[:], expected), name


def test_q8_0_tensors_are_close(tiny_gguf):
    folder, path = tiny_gguf("llama", "Q8_0")
    source = _source(folder)
    ckpt = GGUFCheckpoint(path)
    for name in ckpt.names:
        got, want = ckpt.slice(name)[:], source[name]
        # Q8_0: per block of 32, step = max|w| / 127 stored in fp16: half a step, plus up to 127 steps times
        # the fp16 rounding of the step (2^-11 relative).
        assert (got - want).abs().max() <= want.abs().max() / 127 * (0.5 + 127 / 2048) + 1e-6, name


def test_row_and_column_ranges_are_parts_of_the_whole(tiny_gguf):
    _, path = tiny_gguf("llama", "Q8_0")
    view = GGUFCheckpoint(path).slice("model.layers.0.self_attn.q_proj.weight")  # permuted rows
    whole = view[:]
    assert view.get_shape() == tuple(whole.shape)
    assert torch.equal(view[5:19], whole[5:19])
    assert torch.equal(view[:, 32:64], whole[:, 32:64])
    with pytest.raises(IndexError):
        view[3]


def test_raw_blocks_are_the_rows_in_hf_order(tiny_gguf):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    _, path = tiny_gguf("llama", "Q8_0")
    ckpt = GGUFCheckpoint(path)
    for name in ("model.layers.1.self_attn.k_proj.weight", "model.layers.1.mlp.down_proj.weight"):
        qtype, blocks, shape = ckpt.raw(name)
        assert qtype == GGMLQuantizationType.Q8_0 and blocks.dtype == np.uint8 and blocks.shape[0] == shape[0]
        values = torch.from_numpy(dequantize(blocks, qtype).reshape(shape))
        assert torch.equal(values, ckpt.slice(name)[:]), name


def test_the_llama_q_and_k_rows_are_unpermuted(tiny_gguf):
    # The file holds llama.cpp's order (written by the helper's own permute): reading back equal to the source
    # for q and k, but not for the raw file order, shows the loader undid it.
    folder, path = tiny_gguf("llama")
    ckpt = GGUFCheckpoint(path)
    name = "model.layers.0.self_attn.q_proj.weight"
    stored = torch.from_numpy(np.array(ckpt.slice(name).tensor.data).view(np.float32))
    assert not torch.equal(stored, _source(folder)[name])
    assert torch.equal(ckpt.slice(name)[:], _source(folder)[name])


def test_config_from_the_metadata(tiny_gguf):
    import json

    folder, path = tiny_gguf("qwen3")
    hf = json.loads((folder / "config.json").read_text())
    cfg = GGUFCheckpoint(path).config
    for key in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "max_position_embeddings", "vocab_size"):  # fmt: skip
        assert cfg[key] == hf[key], key
    assert cfg["architectures"] == ["Qwen3ForCausalLM"] and cfg["eos_token_id"] == [hf["eos_token_id"]]


def test_an_unknown_architecture_is_refused_in_one_line(tmp_path):
    import gguf

    writer = gguf.GGUFWriter(str(tmp_path / "bert.gguf"), "bert")
    writer.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(UnsupportedModelError, match="GGUF architecture 'bert' unsupported"):
        GGUFCheckpoint(tmp_path / "bert.gguf")


def test_a_type_without_a_dequantizer_is_refused_naming_it():
    from gguf import GGMLQuantizationType

    check_type(GGMLQuantizationType.Q4_1, "ok")  # has one: no error
    with pytest.raises(UnsupportedModelError, match="'blk.0.attn_q.weight' has type Q8_1"):
        check_type(GGMLQuantizationType.Q8_1, "blk.0.attn_q.weight")


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_plan_reads_a_gguf_file_as_its_source_folder(tiny_gguf, arch):
    from engine.capacity_plan import plan

    folder, path = tiny_gguf(arch)
    assert plan(path, 1 << 30, max_model_len=256) == plan(folder, 1 << 30, max_model_len=256)


@pytest.mark.parametrize(("arch", "qtype"), [("llama", "Q8_0"), ("gemma2", "F16")])
def test_the_fast_reader_agrees_with_gguf_s_own(tiny_gguf, arch, qtype):
    from gguf import GGUFReader

    from engine.gguf_files.reader import LONG_ARRAY, GGUFFile

    _, path = tiny_gguf(arch, qtype)
    theirs, ours = GGUFReader(str(path)), GGUFFile(path)
    for key, field in theirs.fields.items():
        if key.startswith("GGUF."):  # the header's own numbers, not metadata
            continue
        value = field.contents()
        expected = None if isinstance(value, list) and len(value) > LONG_ARRAY else value
        assert (
            ours.fields[key] == pytest.approx(expected)
            if isinstance(value, float)
            else ours.fields[key] == expected
        ), key
    assert [t.name for t in ours.tensors] == [t.name for t in theirs.tensors]
    for mine, other in zip(ours.tensors, theirs.tensors, strict=True):
        assert mine.tensor_type == other.tensor_type and mine.shape == tuple(reversed(other.shape.tolist()))
        assert np.array_equal(mine.data.reshape(-1), np.asarray(other.data).view(np.uint8).reshape(-1)), (
            mine.name
        )
