"""Conveyor's inference engine: continuous batching over a paged KV cache. Knows nothing of Redis."""

from typing import TYPE_CHECKING

from engine.client import EngineClient
from engine.config import EngineConfig
from engine.errors import RejectReason, RequestRejected
from engine.outputs import CompletionOutput, EngineStats, RequestOutput, StepDelta
from engine.prompt import Chat, Prompt
from engine.sampling_params import SamplingParams

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine


def __getattr__(name: str) -> object:
    # LLMEngine pulls in torch and transformers; importing it lazily keeps `import engine` cheap for
    # tools (the scheduler tests, the worker's protocol models) that never build a model.
    if name == "LLMEngine":
        from engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)


__all__ = [
    "Chat",
    "CompletionOutput",
    "EngineClient",
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "Prompt",
    "RejectReason",
    "RequestOutput",
    "RequestRejected",
    "SamplingParams",
    "StepDelta",
]
