"""transformers' own greedy generation: the reference our engine must match token for token."""

from __future__ import annotations

import torch


def hf_model(model_dir, gguf_file: str | None = None):
    """The checkpoint in `model_dir` (or its GGUF file `gguf_file`, dequantized by transformers) in float32."""
    from transformers import AutoModelForCausalLM

    extra = {"gguf_file": gguf_file} if gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, **extra).eval()
    model.generation_config.eos_token_id = None  # generate exactly n tokens, eos included, none suppressed
    return model


def hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=n,
            do_sample=False,
            pad_token_id=0,
        )
    return out[0, len(prompt) :].tolist()


def greedy_agrees(model, prompt: list[int], got: list[int], expected: list[int], tie: float = 1e-4) -> bool:
    """`got` equals transformers' greedy `expected`, or first differs where transformers' own top-2 logits are
    within `tie` (either token is a correct greedy choice there; what follows is then no longer comparable)."""
    for j, (a, b) in enumerate(zip(got, expected, strict=False)):
        if a != b:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + expected[:j]])).logits[0, -1].float()
            top = logits.topk(2).values
            return bool(top[0] - top[1] <= tie) and a in logits.topk(2).indices.tolist()
    return len(got) == len(expected)
