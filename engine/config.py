"""Engine configuration: frozen, validated once. Values found at start-up are passed separately."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the scheduler and block manager need; plain ints so tests build it in one line."""

    num_blocks: int
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    max_model_len: int = 4096
    enable_prefix_caching: bool = True
    # "continuous": iteration-level batching. "static": a new batch starts only when the last one ended.
    scheduling: Literal["continuous", "static"] = "continuous"
    policy: Literal["fcfs", "priority"] = "fcfs"

    def __post_init__(self) -> None:
        _check_at_least_one(
            self, "num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"
        )
        _check_choice(self, "scheduling", ("continuous", "static"))
        _check_choice(self, "policy", ("fcfs", "priority"))


@dataclass(frozen=True)
class EngineConfig:
    """What a user chooses. `LLMEngine(**kwargs)` builds one of these; see README for each knob."""

    model: str
    block_size: int = 16
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    # None: the model's own maximum context.
    max_model_len: int | None = None
    # None: sized from kv_cache_memory.
    num_kv_blocks: int | None = None
    # KV pool budget: bytes on the CPU (None -> 1 GiB); on CUDA a fraction of free memory (None -> 0.9
    # of free memory after the weights are loaded), or bytes when > 1.
    kv_cache_memory: float | None = None
    enable_prefix_caching: bool = True
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: str = "auto"
    scheduling: Literal["continuous", "static"] = "continuous"
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    attention_backend: Literal["auto", "torch", "triton"] = "auto"
    # Capture decode steps as CUDA graphs (one per batch-size bucket) and replay them. CUDA with the
    # Triton backend only: the engine refuses it elsewhere rather than silently running without.
    enable_cuda_graphs: bool = False

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must name a checkpoint folder or hub id")
        if self.block_size not in (8, 16, 32, 64, 128):
            raise ValueError(f"block_size must be one of 8, 16, 32, 64, 128, got {self.block_size}")
        _check_at_least_one(self, "max_num_seqs", "max_num_batched_tokens", "max_model_len", "num_kv_blocks")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0, got {self.kv_cache_memory}")
        _check_choice(self, "dtype", ("auto", "float32", "float16", "bfloat16"))
        _check_choice(self, "scheduling", ("continuous", "static"))
        _check_choice(self, "scheduling_policy", ("fcfs", "priority"))
        _check_choice(self, "attention_backend", ("auto", "torch", "triton"))
        if not isinstance(self.enable_cuda_graphs, bool):
            raise ValueError(f"enable_cuda_graphs must be true or false, got {self.enable_cuda_graphs!r}")
        if self.enable_cuda_graphs and self.attention_backend == "torch":
            raise ValueError("enable_cuda_graphs needs the triton attention backend, not torch")
        if self.enable_cuda_graphs and self.device != "auto" and not self.device.startswith("cuda"):
            raise ValueError(f"enable_cuda_graphs needs a CUDA device, got device={self.device!r}")


def _check_at_least_one(config: object, *names: str) -> None:
    """Each named field, when set (not None), must be an int >= 1."""
    for name in names:
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")


def _check_choice(config: object, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(choices)}; got {value!r}")
