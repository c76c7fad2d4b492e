"""The Llama family (Llama 2/3, Mistral, Qwen2/2.5, Qwen3) over a flat ragged batch and a paged KV cache.

Differences between the family members are two switches on `ModelArgs`: `qkv_bias` (Qwen2) and
`qk_norm` (Qwen3: RMSNorm over each head of q and k before rotary), plus per-layer sliding windows
(`ModelArgs.layer_windows`: Mistral, Qwen2/3 with `use_sliding_window`) passed to the attention backend.

Tensor parallelism (`tp`, engine/distributed/parallel_linear.py and vocab_parallel.py): each rank holds num_heads / size query heads and its
KV heads (replicated when fewer than the ranks), intermediate / size MLP columns, and padded_vocab / size rows
of the embedding and LM head. With `TPGroup.single()` (the default) it is the plain single-device model.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.attention.backend import AttentionBackend
from engine.attention.metadata import AttentionMetadata
from engine.distributed.group import TPGroup
from engine.distributed.parallel_linear import RowParallelLinear, qkv_linear
from engine.distributed.partition import even_span, kv_heads_per_rank
from engine.distributed.vocab_parallel import ParallelLMHead, VocabParallelEmbedding
from engine.models.config import ModelArgs
from engine.models.layers import GatedMLP, RMSNorm, Rotary, apply_rotary

KVCache = tuple[torch.Tensor, torch.Tensor]  # k, v: [num_blocks, block_size, num_kv_heads, head_dim]


class Attention(nn.Module):
    def __init__(self, args: ModelArgs, layer: int = 0, tp: TPGroup | None = None) -> None:
        super().__init__()
        tp = tp or TPGroup.single()
        self.window = args.window(layer)  # sliding window of this layer, None = full causal
        # This rank's heads: the KV pool and the attention backend see only these.
        self.num_heads = even_span(args.num_heads, tp.rank, tp.size, "num_attention_heads").length
        self.num_kv_heads = kv_heads_per_rank(args.num_kv_heads, tp.size)
        self.head_dim = args.head_dim
        self.q_size = self.num_heads * args.head_dim
        self.kv_size = self.num_kv_heads * args.head_dim
        self.scale = args.head_dim**-0.5
        # q, k, v fused into one matmul; the loader fills the three row ranges from q_proj/k_proj/v_proj.
        self.qkv_proj = qkv_linear(
            args.hidden_size, args.head_dim, args.num_heads, args.num_kv_heads, args.qkv_bias, tp
        )
        self.o_proj = RowParallelLinear(args.num_heads * args.head_dim, args.hidden_size, False, tp)
        self.q_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.rms_norm_eps) if args.qk_norm else None

    def forward(
        self,
        x: torch.Tensor,  # [T, hidden]
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        kv: KVCache,
        meta: AttentionMetadata,
        backend: AttentionBackend,
    ) -> torch.Tensor:
        t = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)
        k = k.view(t, self.num_kv_heads, self.head_dim)
        v = v.view(t, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary(q, *cos_sin), apply_rotary(k, *cos_sin)
        backend.write_kv(k, v, kv[0], kv[1], meta)
        out = backend.forward(q, k, v, kv[0], kv[1], meta, self.scale, window=self.window)  # [T, heads, D]
        return self.o_proj(out.reshape(t, self.q_size))


class DecoderLayer(nn.Module):
    def __init__(self, args: ModelArgs, layer: int = 0, tp: TPGroup | None = None) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.self_attn = Attention(args, layer, tp)
        self.post_attention_layernorm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.mlp = GatedMLP(args.hidden_size, args.intermediate_size, tp)

    def forward(self, h, cos_sin, kv, meta, backend) -> torch.Tensor:  # h: [T, hidden]
        h = h + self.self_attn(self.input_layernorm(h), cos_sin, kv, meta, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    """Parameter names follow HF's minus the `model.` prefix, except the fused `qkv_proj`/`gate_up_proj`."""

    def __init__(
        self, args: ModelArgs, backend: AttentionBackend | None = None, tp: TPGroup | None = None
    ) -> None:
        super().__init__()
        self.args = args
        self.tp = tp or TPGroup.single()
        # Set by the loader (or the runner); kept out of forward's signature so all callers share it.
        self.attn_backend = backend
        self.embed_tokens = VocabParallelEmbedding(args.vocab_size, args.hidden_size, self.tp)
        self.layers = nn.ModuleList(DecoderLayer(args, i, self.tp) for i in range(args.num_layers))
        self.norm = RMSNorm(args.hidden_size, args.rms_norm_eps)
        self.rotary = Rotary(args)
        # Its form (`sliced` on the CPU) is chosen when the model is placed (model_loader), not per call.
        self.lm_head = ParallelLMHead(args.vocab_size, args.hidden_size, self.tp)
        if args.tie_word_embeddings:  # same row split, so each rank's head is its embedding shard
            self.lm_head.weight = self.embed_tokens.weight

    def forward(
        self,
        input_ids: torch.Tensor,  # [T] int64
        positions: torch.Tensor,  # [T] int64
        kv_caches: list[KVCache],  # one (k, v) per layer
        meta: AttentionMetadata,
    ) -> torch.Tensor:  # [T, hidden], after the final norm
        backend = self.attn_backend
        if backend is None:
            raise RuntimeError("model.attn_backend is not set")
        cos_sin = self.rotary.cos_sin(positions)
        h = self.embed_tokens(input_ids)
        for layer, kv in zip(self.layers, kv_caches, strict=True):
            h = layer(h, cos_sin, kv, meta, backend)
        return self.norm(h)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """[R, hidden] -> [R, vocab] float32 on rank 0, None on the other ranks.

        A collective under tensor parallelism: every rank must call it with the same rows. Only the rows
        that are sampled reach here (the runner picks them), so R is the batch, not T."""
        local = self.lm_head(hidden)  # [R, padded_vocab / size]: this rank's vocabulary columns
        logits = self.lm_head.gather(local)  # [R, vocab] on rank 0
        return None if logits is None else logits.float()
