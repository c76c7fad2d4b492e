"""quantize_model on a tiny random Llama: every mode close to float32, what is and is not quantized, GGUF
blocks through `raw` (exact), tensor-parallel shards, refusals."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from engine.distributed.group import TPGroup
from engine.distributed.parallel_linear import RowParallelLinear, column_linear, qkv_linear
from engine.distributed.vocab_parallel import ParallelLMHead
from engine.model_loader import load_model
from engine.quant import quantize_model, weight_bytes
from engine.quant.linear import QuantLinear
from tests.helpers.model_helpers import metadata

T = gguf.GGMLQuantizationType
# Relative error (Frobenius norm) against float32 for the tiny random model (hidden 64). Per layer it is
# the rounding itself: measured about 0.006 (int8), 0.08 (int4 g32: random Gaussian weights are its hardest
# case), 0.035 (fp8, weights and activations). Two random layers amplify it about 4.5x in the logits
# (measured 0.026, 0.37, 0.15); the real model's figures are in test_smollm2_fidelity.py.
LAYER_TOLERANCE = {"int8": 0.01, "int4": 0.1, "fp8-emulated": 0.05}
LOGITS_TOLERANCE = {"int8": 0.05, "int4": 0.45, "fp8-emulated": 0.2}


def _logits(net, ids: list[int]) -> torch.Tensor:
    """[len(ids), vocab] float32: one prefill of `ids` over a fresh paged KV pool (4 blocks of 16)."""
    a = net.args
    shape, dtype = (4, 16, a.num_kv_heads, a.head_dim), net.embed_tokens.weight.dtype
    kv = [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(a.num_layers)]
    meta = metadata([(0, len(ids), [0, 1, 2, 3])], 16)
    with torch.inference_mode():
        return net.compute_logits(net(torch.tensor(ids), torch.arange(len(ids)), kv, meta))


IDS = [5, 17, 300, 42, 7, 99, 250, 3, 61, 128, 9, 400]


@pytest.mark.parametrize("mode", ["int8", "int4", "fp8-emulated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_mode_is_close_to_float32(tiny_model_dir, mode, dtype):
    path = tiny_model_dir("llama")
    ref, _ = load_model(path, dtype=torch.float32)
    net, _ = load_model(path, dtype=dtype, quantization=mode)
    x = torch.randn(6, 64, generator=torch.Generator().manual_seed(0))
    bf16 = 0.01 if dtype == torch.bfloat16 else 0.0  # bfloat16 activations add their own rounding
    for name in ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj"):
        want = ref.layers[0].get_submodule(name)(x)
        got = net.layers[0].get_submodule(name)(x.to(dtype)).float()
        assert ((got - want).norm() / want.norm()).item() < LAYER_TOLERANCE[mode] + bf16, name
    want, got = _logits(ref, IDS), _logits(net, IDS)
    assert ((got - want).norm() / want.norm()).item() < LOGITS_TOLERANCE[mode] + 2 * bf16


def test_projections_are_quantized_embedding_head_and_norms_are_not(tiny_model_dir):
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    before = weight_bytes(net)
    summary = quantize_model(net, "int4")
    assert summary.layers == {"int4 g32": 2 * 4}  # 2 layers x (qkv, o, gate_up, down)
    layer = net.layers[0]
    for m in (layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj, layer.mlp.down_proj):
        assert isinstance(m, QuantLinear)
    assert isinstance(net.lm_head, ParallelLMHead) and net.lm_head.weight.dtype == torch.float32
    assert net.embed_tokens.weight.dtype == torch.float32
    # int4 g32 with float32 scales and zeros: 0.5 + 8/32 bytes per weight instead of 4.
    linear = sum(
        m.kernel.in_features * m.kernel.out_features for m in net.modules() if isinstance(m, QuantLinear)
    )
    assert before - weight_bytes(net) == pytest.approx(linear * (4 - 0.75), rel=1e-6)


def test_none_and_auto_without_blocks_change_nothing(tiny_model_dir):
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    for mode in ("none", "auto"):
        assert quantize_model(net, mode).layers == {}
    assert not any(isinstance(m, QuantLinear) for m in net.modules())


def test_refusals(tiny_model_dir):
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    with pytest.raises(ValueError, match="quantization must be one of auto, none, int8"):
        quantize_model(net, "int3")
    with pytest.raises(ValueError, match="fp8 needs a CUDA GPU of compute capability 8.9"):
        quantize_model(net, "fp8")
    with pytest.raises(ValueError, match="quantization int8 runs on the native Llama-family model only"):
        load_model(tiny_model_dir("llama"), model_impl="transformers", quantization="int8")


def _file_of(net, qtypes: dict[str, object]):
    """A stand-in for a GGUF checkpoint's `raw`: the model's own projections quantized by gguf, under HF
    names. qtypes: projection (q_proj, ..., down_proj) -> GGML type."""
    a = net.args
    q, kv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
    files: dict[str, tuple] = {}
    for i, layer in enumerate(net.layers):
        parts = {
            "self_attn.qkv_proj": {"q_proj": (0, q), "k_proj": (q, q + kv), "v_proj": (q + kv, q + 2 * kv)},
            "self_attn.o_proj": {"o_proj": (0, None)},
            "mlp.gate_up_proj": {
                "gate_proj": (0, a.intermediate_size),
                "up_proj": (a.intermediate_size, None),
            },
            "mlp.down_proj": {"down_proj": (0, None)},
        }
        for module, names in parts.items():
            w = layer.get_submodule(module).weight.detach().numpy()
            prefix = module.split(".")[0]
            for name, (start, stop) in names.items():
                rows = np.ascontiguousarray(w[start:stop])
                blocks = gguf.quants.quantize(rows, qtypes[name])
                files[f"model.layers.{i}.{prefix}.{name}.weight"] = (qtypes[name], blocks, rows.shape)
    return files


def _read_back(kernel, k: int) -> torch.Tensor:
    return kernel(torch.eye(k)).t()


def test_gguf_blocks_are_served_in_their_own_precision(tiny_model_dir):
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    qtypes = {
        "q_proj": T.Q4_1,
        "k_proj": T.Q4_1,
        "v_proj": T.Q4_1,
        "o_proj": T.Q4_0,
        "gate_proj": T.Q4_1,
        "up_proj": T.Q8_0,
        "down_proj": T.F16,
    }
    files = _file_of(net, qtypes)
    summary = quantize_model(net, "auto", raw=files.__getitem__)
    assert summary.layers == {
        "int4 g32 (Q4_1 blocks)": 2,  # qkv
        "int4 g32 (Q4_0 blocks)": 2,  # o
        "as loaded (Q4_1/Q8_0)": 2,  # gate_up: mixed types, no one kernel
        "as loaded (F16)": 2,  # down
    }
    qkv = net.layers[1].self_attn.qkv_proj
    want = np.concatenate(
        [
            gguf.quants.dequantize(files[f"model.layers.1.self_attn.{p}.weight"][1], T.Q4_1)
            for p in ("q_proj", "k_proj", "v_proj")
        ]
    )
    assert torch.equal(_read_back(qkv.kernel, qkv.in_features), torch.from_numpy(want))


def test_explicit_int8_takes_exact_q8_0_blocks_and_requantizes_the_rest(tiny_model_dir):
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    qtypes = dict.fromkeys(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], T.Q8_0
    )
    files = _file_of(net, qtypes)
    # o_proj: one scale per row (every block of a row gets the row's first scale), so exactly int8.
    for i in range(2):
        name = f"model.layers.{i}.self_attn.o_proj.weight"
        qtype, blocks, shape = files[name]
        b = blocks.reshape(shape[0], -1, 34).copy()
        b[:, :, :2] = b[:, :1, :2]
        files[name] = (qtype, b.reshape(shape[0], -1), shape)
    summary = quantize_model(net, "int8", raw=files.__getitem__)
    assert summary.layers == {"int8 (Q8_0 blocks)": 2, "int8": 6}
    o = net.layers[0].self_attn.o_proj
    qtype, blocks, shape = files["model.layers.0.self_attn.o_proj.weight"]
    assert torch.equal(
        _read_back(o.kernel, o.in_features), torch.from_numpy(gguf.quants.dequantize(blocks, qtype))
    )


def test_missing_blocks_keep_the_loaded_weights(tiny_model_dir):
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    assert quantize_model(net, "auto", raw=lambda name: None).layers == {"as loaded": 8}
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    assert quantize_model(net, "int4", raw={}.__getitem__).layers == {"int4 g32": 8}


@pytest.mark.parametrize("rank", [0, 1])
def test_tensor_parallel_ranks_take_their_rows_and_columns_of_the_blocks(rank):
    hidden, head_dim, heads, kv_heads = 64, 16, 4, 2
    tp = TPGroup(rank, 2)
    rng = np.random.default_rng(0)
    full = {
        n: rng.standard_normal((r, hidden)).astype(np.float32)
        for n, r in (("q_proj", 64), ("k_proj", 32), ("v_proj", 32))
    }
    files = {
        f"model.layers.0.self_attn.{n}.weight": (T.Q4_1, gguf.quants.quantize(w, T.Q4_1), w.shape)
        for n, w in full.items()
    }
    qkv = qkv_linear(hidden, head_dim, heads, kv_heads, False, tp)
    holder = torch.nn.Module()
    holder.layers = torch.nn.ModuleList([torch.nn.Module()])
    holder.layers[0].self_attn = torch.nn.Module()
    holder.layers[0].self_attn.qkv_proj = qkv
    o = RowParallelLinear(128, hidden, False, tp)  # in 128 split in two: columns 64 * rank, on 32-blocks
    holder.layers[0].self_attn.o_proj = o
    o_full = rng.standard_normal((hidden, 128)).astype(np.float32)
    files["model.layers.0.self_attn.o_proj.weight"] = (
        T.Q4_0,
        gguf.quants.quantize(o_full, T.Q4_0),
        o_full.shape,
    )
    for m in (qkv, o):
        m.weight.data.zero_()
    summary = quantize_model(holder, "auto", raw=files.__getitem__)
    assert summary.layers == {"int4 g32 (Q4_1 blocks)": 1, "int4 g32 (Q4_0 blocks)": 1}
    deq = {n: gguf.quants.dequantize(b, q) for n, (q, b, _) in files.items()}
    p = "model.layers.0.self_attn."
    want_qkv = np.concatenate(
        [
            deq[p + "q_proj.weight"][32 * rank : 32 * rank + 32],
            deq[p + "k_proj.weight"][16 * rank : 16 * rank + 16],
            deq[p + "v_proj.weight"][16 * rank : 16 * rank + 16],
        ]
    )
    got = holder.layers[0].self_attn.qkv_proj.kernel
    assert torch.equal(_read_back(got, hidden), torch.from_numpy(want_qkv))
    got_o = holder.layers[0].self_attn.o_proj
    assert got_o.reduce is tp
    assert torch.equal(
        _read_back(got_o.kernel, 64),
        torch.from_numpy(deq[p + "o_proj.weight"][:, 64 * rank : 64 * rank + 64]),
    )


def test_row_parallel_columns_that_split_a_block_keep_the_loaded_shard():
    o = RowParallelLinear(96, 64, False, TPGroup(1, 2))  # 48 columns per rank: not on 32-blocks
    holder = torch.nn.Module()
    holder.o_proj = o
    w = np.random.default_rng(1).standard_normal((64, 96)).astype(np.float32)
    files = {"model.o_proj.weight": (T.Q4_0, gguf.quants.quantize(w, T.Q4_0), w.shape)}
    assert quantize_model(holder, "auto", raw=files.__getitem__).layers == {"as loaded": 1}


def test_blocks_a_kernel_cannot_take_stay_as_loaded_and_say_why():
    holder = torch.nn.Module()
    holder.proj = column_linear(64, 24, False, TPGroup.single())  # 24 rows: not a multiple of 16
    w = np.random.default_rng(2).standard_normal((24, 64)).astype(np.float32)
    files = {"model.proj.weight": (T.Q4_1, gguf.quants.quantize(w, T.Q4_1), w.shape)}
    layers = quantize_model(holder, "auto", raw=files.__getitem__).layers
    assert layers == {
        "as loaded (Q4_1): out_features 24 is not a multiple of 16 (the CPU int4 packing's tile)": 1
    }


def test_raw_may_name_tensors_without_the_model_prefix(tiny_model_dir):
    net, _ = load_model(tiny_model_dir("llama"), dtype=torch.float32)
    qtypes = dict.fromkeys(
        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], T.Q4_0
    )
    files = {name.removeprefix("model."): blocks for name, blocks in _file_of(net, qtypes).items()}
    assert quantize_model(net, "auto", raw=files.__getitem__).layers == {"int4 g32 (Q4_0 blocks)": 8}
