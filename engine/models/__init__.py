"""Model code for the Llama family, written against the paged attention backend interface.

The architecture list (registry) imports no torch; the model classes load on first use.
"""

from typing import TYPE_CHECKING

from engine.models.registry import (
    ARCHITECTURES,
    FAMILIES,
    UnsupportedModelError,
    build_model,
    map_weight_name,
    supported_names,
)

if TYPE_CHECKING:
    from engine.models.config import ModelArgs
    from engine.models.llama import LlamaForCausalLM


def __getattr__(name: str) -> object:
    if name == "ModelArgs":
        from engine.models.config import ModelArgs

        return ModelArgs
    if name == "LlamaForCausalLM":
        from engine.models.llama import LlamaForCausalLM

        return LlamaForCausalLM
    raise AttributeError(name)


__all__ = [
    "ARCHITECTURES",
    "FAMILIES",
    "LlamaForCausalLM",
    "ModelArgs",
    "UnsupportedModelError",
    "build_model",
    "map_weight_name",
    "supported_names",
]
