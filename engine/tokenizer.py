"""The tokenizer, loaded offline from the checkpoint folder, with eos ids and chat-template rendering."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import AutoTokenizer


class Tokenizer:
    def __init__(self, model_dir: str | Path, trust_remote_code: bool = False) -> None:
        self.model_dir = Path(model_dir)
        self.hf = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=trust_remote_code)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """The tokenizer's eos plus every eos named by config.json and generation_config.json."""
        ids = {self.hf.eos_token_id} if self.hf.eos_token_id is not None else set()
        for name in ("config.json", "generation_config.json"):
            path = self.model_dir / name
            if path.exists():
                value = json.loads(path.read_text()).get("eos_token_id")
                ids.update(value if isinstance(value, list) else [] if value is None else [value])
        return frozenset(int(i) for i in ids)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.hf.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special_tokens)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def render_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        if not self.has_chat_template:
            raise ValueError(f"the tokenizer in {self.model_dir} has no chat template")
        return self.hf.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        # The rendered template already holds any bos/special tokens; do not add them twice.
        return self.encode(self.render_chat(messages, add_generation_prompt), add_special_tokens=False)


def load_tokenizer(model_dir: str | Path, trust_remote_code: bool = False) -> Tokenizer:
    return Tokenizer(model_dir, trust_remote_code=trust_remote_code)
