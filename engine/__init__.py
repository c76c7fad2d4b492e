"""Conveyor's inference engine: continuous batching over a paged KV cache. Knows nothing of Redis."""

from engine.config import EngineConfig
from engine.errors import RequestRejected
from engine.outputs import CompletionOutput, EngineStats, RequestOutput, StepDelta
from engine.sampling_params import SamplingParams


def __getattr__(name: str):
    # LLMEngine pulls in torch and transformers; importing it lazily keeps `import engine` cheap for
    # tools (the scheduler tests, the worker's protocol models) that never build a model.
    if name == "LLMEngine":
        from engine.llm_engine import LLMEngine

        return LLMEngine
    raise AttributeError(name)


__all__ = [
    "CompletionOutput",
    "EngineConfig",
    "EngineStats",
    "LLMEngine",
    "RequestOutput",
    "RequestRejected",
    "SamplingParams",
    "StepDelta",
]
