"""Engine configuration: frozen, validated once. Values found at start-up are passed separately.

Each `EngineConfig` field is also a `conveyor worker` option (worker/cli/options.py builds them): its name
with dashes, its default, choices from its Literal type and the help text in its metadata.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from kernels.block_sizes import BLOCK_SIZES, TRITON_BLOCK_SIZES


def knob(default: Any, help: str, cli: str | None = None, min: float | None = None) -> Any:
    """A config field with the help text its command-line option shows (worker/cli/options.py), the
    option's name when it is not the field's own, and the least value the option takes. The one `knob`
    of every config dataclass (engine, worker, batch API, Redis connection)."""
    metadata: dict[str, Any] = {"help": help}
    if cli is not None:
        metadata["cli"] = cli
    if min is not None:
        metadata["min"] = min
    return field(default=default, metadata=metadata)


@dataclass(frozen=True)
class EngineConfig:
    """What a user chooses. `LLMEngine(model, **kwargs)` builds one of these."""

    model: str = field(metadata={"help": "checkpoint folder, hub id, or tiny[:<arch>] (a random tiny model)"})
    block_size: int = knob(16, "tokens per KV block: 8, 16, 32, 64 or 128 (8: torch backend only)")
    max_num_seqs: int = knob(64, "most sequences in one step")
    max_num_batched_tokens: int = knob(2048, "most tokens in one step (prefill chunks + decodes)")
    max_model_len: int | None = knob(None, "longest sequence, prompt + output (default: the model's)")
    max_prompt_tokens: int | None = knob(
        None, "longest prompt accepted (default: max_model_len - 1); longer ones are rejected"
    )
    num_kv_blocks: int | None = knob(None, "KV blocks in the pool (default: sized from kv_cache_memory)")
    kv_cache_memory: float | None = knob(
        None,
        "KV pool budget: bytes on the CPU (default 1 GiB); on CUDA a fraction of the free memory after "
        "the weights load (default 0.9), less the peak a warm-up step at the largest batch measured, or "
        "bytes when > 1 (engine/kv_sizing.py)",
    )
    enable_prefix_caching: bool = knob(True, "reuse the KV blocks of shared prompt prefixes")
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = knob(
        "auto",
        "weights and KV dtype (auto: float32 on the CPU; on CUDA the checkpoint's fp16/bf16, else bf16 or fp16)",
    )
    device: str = knob("auto", "auto, cpu, cuda or cuda:N")
    scheduling: Literal["continuous", "static"] = knob(
        "continuous", "continuous: iteration-level batching; static: a new batch when the last ends"
    )
    scheduling_policy: Literal["fcfs", "priority"] = knob("fcfs", "which waiting request goes first")
    kv_allocation: Literal["paged", "reserve_max"] = knob(
        "paged",
        "paged: KV blocks on demand; reserve_max: every request reserves max_model_len tokens of blocks when "
        "admitted, as contiguous-allocation servers do (for comparison: it wastes what answers leave unused)",
    )
    async_scheduling: bool = knob(
        False,
        "schedule step k+1 while the device runs step k (its sampled ids enter k+1's inputs on the device) "
        "and turn step k's ids into outputs while k+1 runs; same tokens as without",
    )
    attention_backend: Literal["auto", "torch", "triton"] = knob(
        "auto", "auto: Triton kernels on CUDA, torch elsewhere"
    )
    model_impl: Literal["auto", "native", "transformers"] = knob(
        "auto",
        "native: Conveyor's own Llama-family code; transformers: the model's own transformers modules on "
        "Conveyor's paged attention (any decoder-only LM); auto: native for the Llama family, else transformers",
    )
    enable_cuda_graphs: bool = knob(
        False,
        "capture decode steps as CUDA graphs, one per batch-size bucket, and replay them (CUDA with the "
        "Triton backend only; refused elsewhere rather than silently run without)",
    )
    tensor_parallel_size: int = knob(
        1,
        "split the model over this many processes of one machine (one GPU each on CUDA, gloo on the CPU): "
        "attention heads, MLP columns/rows and the vocabulary are divided among them",
    )
    distributed_timeout_s: float = knob(
        120.0,
        "tensor parallelism: a rank that does not answer a collective within this many seconds (or that "
        "dies) ends the engine with an error",
    )
    quantization: Literal["auto", "none", "int8", "int4", "fp8"] = knob(
        "auto",
        "weight-only quantization of the linear layers at load (native models; docs/operations.md): int8, "
        "int4 (groups of 32) on CPU and CUDA, fp8 on CUDA sm_89+; auto: a GGUF file's own Q4_0/Q4_1/Q8_0 "
        "blocks as they are, a safetensors checkpoint as it is; none: everything in the serving dtype",
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model must name a checkpoint folder or hub id")
        if self.block_size not in BLOCK_SIZES:
            raise ValueError(
                f"block_size must be one of {', '.join(map(str, BLOCK_SIZES))}, got {self.block_size}"
            )
        # "auto" on a named CUDA device is Triton (engine.attention.backend); "auto" on device "auto" is
        # checked again by the engine once the device is known, still before the KV pool is allocated.
        on_cuda = self.device.startswith("cuda")
        if self.attention_backend == "triton" or (self.attention_backend == "auto" and on_cuda):
            check_backend_block_size(self.block_size, "triton")
        _check_at_least_one(
            self,
            "max_num_seqs",
            "max_num_batched_tokens",
            "max_model_len",
            "max_prompt_tokens",
            "num_kv_blocks",
            "tensor_parallel_size",
        )
        if self.distributed_timeout_s <= 0:
            raise ValueError(f"distributed_timeout_s must be > 0, got {self.distributed_timeout_s}")
        if self.tensor_parallel_size > 1 and self.enable_cuda_graphs:
            # Graph capture would have to record the collectives of every rank in step; not done yet.
            raise ValueError("enable_cuda_graphs is not supported with tensor_parallel_size > 1 yet")
        if self.kv_cache_memory is not None and self.kv_cache_memory <= 0:
            raise ValueError(f"kv_cache_memory must be > 0, got {self.kv_cache_memory}")
        if not isinstance(self.enable_cuda_graphs, bool):
            raise ValueError(f"enable_cuda_graphs must be true or false, got {self.enable_cuda_graphs!r}")
        if self.enable_cuda_graphs and self.attention_backend == "torch":
            raise ValueError("enable_cuda_graphs needs the triton attention backend, not torch")
        if self.enable_cuda_graphs and self.device != "auto" and not self.device.startswith("cuda"):
            raise ValueError(f"enable_cuda_graphs needs a CUDA device, got device={self.device!r}")
        check_choices(self)


def engine_default(name: str) -> Any:
    """EngineConfig's default for a field, so that SchedulerConfig does not state it a second time."""
    return next(f.default for f in fields(EngineConfig) if f.name == name)


@dataclass(frozen=True)
class SchedulerConfig:
    """Everything the scheduler and block manager need; plain ints so tests build it in one line. Defaults
    are EngineConfig's; max_model_len's (there None: the model's) is a length tests can build with."""

    num_blocks: int
    block_size: int = engine_default("block_size")
    max_num_seqs: int = engine_default("max_num_seqs")
    max_num_batched_tokens: int = engine_default("max_num_batched_tokens")
    max_model_len: int = 4096
    enable_prefix_caching: bool = engine_default("enable_prefix_caching")
    # "continuous": iteration-level batching. "static": a new batch starts only when the last one ended.
    scheduling: Literal["continuous", "static"] = engine_default("scheduling")
    policy: Literal["fcfs", "priority"] = engine_default("scheduling_policy")
    # "paged": blocks on demand. "reserve_max": max_model_len reserved per request at admission.
    kv_allocation: Literal["paged", "reserve_max"] = engine_default("kv_allocation")

    def __post_init__(self) -> None:
        _check_at_least_one(
            self, "num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"
        )
        check_choices(self)


def check_backend_block_size(block_size: int, backend: str) -> None:
    """Refuse a block size the attention backend's kernels cannot run (before any memory is allocated)."""
    if backend == "triton" and block_size not in TRITON_BLOCK_SIZES:
        sizes = ", ".join(map(str, TRITON_BLOCK_SIZES))
        raise ValueError(
            f"block_size {block_size} is not supported by the triton attention backend (CUDA's default): "
            f"use one of {sizes}, or attention_backend='torch'"
        )


def literal_choices(cls: type, name: str) -> tuple[str, ...] | None:
    """The allowed values of a field typed `Literal[...]` (None for any other type)."""
    hint = typing.get_type_hints(cls)[name]
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def check_choices(config: Any) -> None:
    """Every Literal-typed field holds one of its values; the error names the field and the choices."""
    for f in fields(config):
        choices = literal_choices(type(config), f.name)
        value = getattr(config, f.name)
        if choices is not None and value not in choices:
            raise ValueError(f"{f.name} must be one of {', '.join(choices)}; got {value!r}")


def _check_at_least_one(config: object, *names: str) -> None:
    """Each named field, when set (not None), must be an int >= 1."""
    for name in names:
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
