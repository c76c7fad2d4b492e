"""Model code for the Llama family, written against the paged attention backend interface."""

from engine.models.config import ModelArgs, UnsupportedModelError, supported_names
from engine.models.llama import LlamaForCausalLM
from engine.models.registry import build_model, map_weight_name

__all__ = [
    "LlamaForCausalLM",
    "ModelArgs",
    "UnsupportedModelError",
    "build_model",
    "map_weight_name",
    "supported_names",
]
