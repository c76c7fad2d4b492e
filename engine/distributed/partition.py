"""Megatron-style partition rules: which heads, columns and vocabulary rows each rank holds.

Every place that sizes or slices a tensor per rank (model loading, the KV pool, `conveyor plan`) calls these,
so the rules live once:

    query heads   split evenly (num_heads % size == 0)
    KV heads      split evenly when num_kv_heads >= size; otherwise each KV head is replicated on
                  size // num_kv_heads consecutive ranks (rank r holds head r // (size // num_kv_heads))
    columns/rows  of MLP projections split evenly (intermediate % size == 0)
    vocabulary    padded up to a multiple of size, then split evenly (a rank's rows past the real
                  vocabulary are zero and their logits are dropped)

Plain ints only: importable without torch.
"""

from __future__ import annotations

from typing import NamedTuple


class Span(NamedTuple):
    start: int
    length: int

    @property
    def stop(self) -> int:
        return self.start + self.length


def check_divisible(what: str, total: int, size: int) -> None:
    if total % size:
        raise ValueError(f"{what}={total} cannot be split evenly over tensor_parallel_size={size}")


def even_span(total: int, rank: int, size: int, what: str = "dimension") -> Span:
    """Rank's contiguous share of `total` items, which must divide evenly."""
    check_divisible(what, total, size)
    per = total // size
    return Span(rank * per, per)


def kv_heads_per_rank(num_kv_heads: int, size: int) -> int:
    if num_kv_heads >= size:
        check_divisible("num_key_value_heads", num_kv_heads, size)
        return num_kv_heads // size
    if size % num_kv_heads:
        raise ValueError(
            f"num_key_value_heads={num_kv_heads} cannot be replicated evenly over "
            f"tensor_parallel_size={size} (the size must be a multiple of it)"
        )
    return 1


def kv_head_span(num_kv_heads: int, rank: int, size: int) -> Span:
    """The KV heads rank holds (replicated when there are fewer KV heads than ranks)."""
    per = kv_heads_per_rank(num_kv_heads, size)
    if num_kv_heads >= size:
        return Span(rank * per, per)
    return Span(rank // (size // num_kv_heads), 1)


def padded_vocab(vocab_size: int, size: int) -> int:
    return -(-vocab_size // size) * size


def vocab_span(vocab_size: int, rank: int, size: int) -> Span:
    """Rank's rows of the (padded) vocabulary; the last rank's may run past vocab_size."""
    return even_span(padded_vocab(vocab_size, size), rank, size, "padded vocabulary")


def check_model_splits(num_heads: int, num_kv_heads: int, intermediate: int, size: int) -> None:
    """Raise ValueError naming the first dimension that does not split over `size` ranks."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    check_divisible("num_attention_heads", num_heads, size)
    kv_heads_per_rank(num_kv_heads, size)
    check_divisible("intermediate_size", intermediate, size)
