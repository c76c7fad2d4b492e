"""What a request's prompt may be: text, token ids, or chat messages the engine renders with the model's
chat template. The engine alone turns any of them into token ids (engine/tokenizer.py)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias


@dataclass(frozen=True)
class Chat:
    """Chat messages ({"role": ..., "content": ...}), rendered with add_generation_prompt=True."""

    messages: Sequence[Mapping[str, Any]]


# str: encoded with the tokenizer's special tokens (BOS); Sequence[int]: used as given; Chat: templated.
Prompt: TypeAlias = str | Sequence[int] | Chat
