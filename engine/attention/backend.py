"""The interface between model code and attention implementations.

Model code calls `write_kv` then `forward` once per layer per step. Backends own no state beyond what
they precompute from the metadata; the KV pool tensors are passed in.
"""

from __future__ import annotations

from typing import Protocol

import torch

from engine.attention.metadata import AttentionMetadata


class AttentionBackend(Protocol):
    name: str

    def write_kv(
        self,
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        v_cache: torch.Tensor,  # [num_blocks, block_size, num_kv_heads, head_dim]
        meta: AttentionMetadata,
    ) -> None:
        """Scatter this step's new K/V rows into the pool at `meta.slot_mapping` (slot -1 skipped)."""
        ...

    def forward(
        self,
        query: torch.Tensor,  # [num_tokens, num_q_heads, head_dim]
        key: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]: this step's rows, as passed to write_kv
        value: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
        *,
        window: int | None = None,
        softcap: float | None = None,
    ) -> torch.Tensor:  # [num_tokens, num_q_heads, head_dim], dtype of query
        """Causal attention of each new token over its sequence's context (GQA by head grouping).

        The context is in the cache after `write_kv`; `key`/`value` hold this step's rows too, so a backend
        may read a prefill chunk with no cached context from them instead of gathering it back.

        Both options are per call, so per layer:
        - `window`: a query at position i sees keys j with i - window < j <= i, `window` positions counting
          itself (transformers' `sliding_window`, masking_utils.sliding_window_overlay). None: full causal.
        - `softcap`: logits become softcap * tanh(logits / softcap) before the softmax, where logits are
          q.k * scale (Gemma 2's `attn_logit_softcapping`). None: off."""
        ...


def get_attention_backend(name: str, device: torch.device) -> AttentionBackend:
    """Resolve "auto" | "torch" | "triton" to a backend. "auto" is Triton on CUDA, torch elsewhere."""
    if name == "auto":
        name = "triton" if device.type == "cuda" else "torch"
    if name == "torch":
        from engine.attention.torch_backend import TorchAttentionBackend

        return TorchAttentionBackend()
    if name == "triton":
        try:
            from engine.attention.triton_backend import TritonAttentionBackend
        except ModuleNotFoundError as exc:
            if exc.name is None or exc.name.partition(".")[0] != "triton":
                raise
            # A CUDA build of torch on Linux brings triton; a CPU install has none (pyproject's extras).
            raise RuntimeError(
                "the triton attention backend needs triton, which is not installed: "
                "pip install 'conveyor[gpu]', or attention_backend='torch'"
            ) from None
        return TritonAttentionBackend()
    raise ValueError(f"unknown attention backend {name!r}; choose 'auto', 'torch' or 'triton'")


def check_window_softcap(window: int | None, softcap: float | None) -> None:
    """Refuse option values no backend can honour (a window of 0 would leave a query with no key)."""
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ValueError(f"window must be None or an int >= 1, got {window!r}")
    if softcap is not None and not softcap > 0:
        raise ValueError(f"softcap must be None or > 0, got {softcap!r}")
