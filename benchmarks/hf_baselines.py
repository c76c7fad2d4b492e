"""transformers on the same weights as the engine: the greedy reference and two throughput baselines.

load(model, dtype, device)          AutoModelForCausalLM (a .gguf file: dequantized by transformers)
greedy(model, prompt, n)            `generate`, greedy, exactly n new tokens, one prompt at a time
agrees(model, prompt, got, ref)     got == ref, or the first difference is a near-tie under transformers
generate_throughput(...)            static batching: `generate` over the whole batch, left-padded
batch_throughput(...)               transformers' continuous batching, `generate_batch`
"""

from __future__ import annotations

import time
from pathlib import Path

import torch


def load(model: Path, dtype: torch.dtype, device: str):
    from transformers import AutoModelForCausalLM

    if model.suffix == ".gguf":
        net = AutoModelForCausalLM.from_pretrained(str(model.parent), gguf_file=model.name, dtype=dtype)
    else:
        net = AutoModelForCausalLM.from_pretrained(str(model), dtype=dtype)
    net = net.to(device).eval()
    net.generation_config.eos_token_id = None  # exactly n tokens, eos included, none suppressed
    return net


def greedy(net, prompt: list[int], n: int) -> list[int]:
    ids = torch.tensor([prompt], device=net.device)
    with torch.no_grad():
        out = net.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=n, do_sample=False, pad_token_id=0
        )
    return out[0, len(prompt) :].tolist()


def tie_margin(top: float) -> float:
    """Two logits this close are a tie in bf16: a few units in the last place at the top logit's size
    (bf16 keeps 8 bits of mantissa), and no less than 1e-4 (fp32 runs)."""
    return max(1e-4, 4 * abs(top) * 2.0**-8)


def agrees(net, prompt: list[int], got: list[int], ref: list[int]) -> dict:
    """{"exact", "agrees", "first_difference"}: `got` equals transformers' greedy `ref`, or at their first
    difference both tokens are within a bf16 tie of transformers' top logit (either is a correct greedy
    choice there; later tokens are no longer comparable). Anything else is a wrong token."""
    for j, (a, b) in enumerate(zip(got, ref, strict=False)):
        if a != b:
            with torch.no_grad():
                logits = net(torch.tensor([prompt + ref[:j]], device=net.device)).logits[0, -1].float()
            top = float(logits.max())
            ok = top - float(logits[a]) <= tie_margin(top)
            return {"exact": False, "agrees": ok, "first_difference": j}
    same = len(got) == len(ref)
    return {"exact": same, "agrees": same, "first_difference": None if same else min(len(got), len(ref))}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def generate_throughput(net, prompts: list[list[int]], new_tokens: int, batch: int) -> dict:
    """Static batching: groups of `batch` prompts, left-padded, `new_tokens` each (no EOS stop)."""
    produced, start = 0, time.perf_counter()
    for i in range(0, len(prompts), batch):
        group = prompts[i : i + batch]
        width = max(map(len, group))
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, p in enumerate(group):
            ids[r, width - len(p) :] = torch.tensor(p)
            mask[r, width - len(p) :] = 1
        with torch.no_grad():
            out = net.generate(
                ids.to(net.device),
                attention_mask=mask.to(net.device),
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        produced += (out.shape[1] - width) * len(group)
    _sync(net.device)
    seconds = time.perf_counter() - start
    return {"output_tokens": produced, "seconds": seconds, "tokens_per_s": produced / seconds}


def batch_throughput(
    net, prompts: list[list[int]], new_tokens: int, batch: int, block_size: int = 256
) -> dict:
    """transformers' continuous batching (`generate_batch`) with a paged cache sized for the batch."""
    import inspect

    from transformers import ContinuousBatchingConfig, GenerationConfig

    longest = max(map(len, prompts)) + new_tokens
    blocks = batch * -(-longest // block_size) + 8
    # transformers 5.17 (the GPU machine's) names the page size block_size; later ones page_size.
    size = (
        "page_size" if "page_size" in inspect.signature(ContinuousBatchingConfig).parameters else "block_size"
    )
    cb = ContinuousBatchingConfig(
        **{size: block_size},
        num_blocks=blocks,
        max_batch_tokens=4096,
        allow_block_sharing=False,
        use_cuda_graph=False,
    )
    gen = GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    start = time.perf_counter()
    results = net.generate_batch(inputs=prompts, generation_config=gen, continuous_batching_config=cb)
    _sync(net.device)
    seconds = time.perf_counter() - start
    produced = sum(len(r.generated_tokens) for r in results.values())
    return {"output_tokens": produced, "seconds": seconds, "tokens_per_s": produced / seconds}
