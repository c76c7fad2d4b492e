"""Attention over the paged KV cache: one metadata type, interchangeable backends."""

from engine.attention.backend import AttentionBackend, get_attention_backend
from engine.attention.metadata import AttentionMetadata

__all__ = ["AttentionBackend", "AttentionMetadata", "get_attention_backend"]
