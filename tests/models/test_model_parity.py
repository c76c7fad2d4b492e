"""Our model through the paged path gives transformers' logits (fp32), for every family and variant."""

from __future__ import annotations

import json

import pytest
import torch

from engine.kv_cache import allocate_kv_pool, layer_views
from engine.model_loader import load_model
from tests.helpers.hf_reference import hf_model
from tests.helpers.model_helpers import VARIANTS, metadata

BLOCK = 4
ATOL = 2e-5


@pytest.fixture(scope="module", params=list(VARIANTS))
def case(request, tiny_model_dir):
    arch, overrides = VARIANTS[request.param]
    model_dir = tiny_model_dir(arch, **overrides)
    model, spec = load_model(model_dir, dtype="float32", device="cpu")
    return model_dir, model, spec, hf_model(model_dir)


def _scattered_blocks(n: int, num_blocks: int, seed: int) -> list[int]:
    return torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))[:n].tolist()


def test_prefill_logits_match(case):
    _, model, spec, hf = case
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, spec.vocab_size, (n,), generator=g) for n in (21, 6, 13)]
    pool = allocate_kv_pool(spec, 64, BLOCK, "cpu")
    blocks = _scattered_blocks(16, 64, seed=2)
    tables = [blocks[0:6], blocks[6:8], blocks[8:12]]
    meta = metadata([(0, len(p), t) for p, t in zip(prompts, tables, strict=True)], BLOCK)
    ids = torch.cat(prompts)
    pos = torch.cat([torch.arange(len(p)) for p in prompts])
    with torch.inference_mode():
        logits = model.compute_logits(model(ids, pos, layer_views(pool), meta))
        start = 0
        for p in prompts:
            ref = hf(p[None]).logits[0]
            torch.testing.assert_close(logits[start : start + len(p)], ref, atol=ATOL, rtol=0)
            start += len(p)


def test_chunked_prefill_and_decode_match(case):
    """Two prefill chunks (the second attends to cached context) then a decode, in mixed batches."""
    _, model, spec, hf = case
    prompt = torch.randint(3, spec.vocab_size, (19,), generator=torch.Generator().manual_seed(3))
    other = torch.randint(3, spec.vocab_size, (5,), generator=torch.Generator().manual_seed(4))
    pool = allocate_kv_pool(spec, 32, BLOCK, "cpu")
    kv = layer_views(pool)
    blocks = _scattered_blocks(8, 32, seed=5)
    a, b = blocks[:5], blocks[5:7]
    ref = hf(prompt[None]).logits[0]
    ref_other = hf(other[None]).logits[0]
    with torch.inference_mode():
        # step 1: first 7 tokens of `prompt` and all of `other`
        meta = metadata([(0, 7, a), (0, 5, b)], BLOCK)
        out = model.compute_logits(
            model(torch.cat([prompt[:7], other]), torch.cat([torch.arange(7), torch.arange(5)]), kv, meta)
        )
        torch.testing.assert_close(out[:7], ref[:7], atol=ATOL, rtol=0)
        # step 2: the next 11 tokens of `prompt` (cached context 7) and a decode of `other`'s last token
        # is already done; decode the token after it instead (compare against transformers on 6 tokens).
        nxt = torch.tensor([int(ref_other[-1].argmax())])
        meta = metadata([(7, 11, a), (5, 1, b)], BLOCK)
        out = model.compute_logits(
            model(
                torch.cat([prompt[7:18], nxt]), torch.cat([torch.arange(7, 18), torch.tensor([5])]), kv, meta
            )
        )
        torch.testing.assert_close(out[:11], ref[7:18], atol=ATOL, rtol=0)
        ref6 = hf(torch.cat([other, nxt])[None]).logits[0, -1]
        torch.testing.assert_close(out[11], ref6, atol=ATOL, rtol=0)
        # step 3: pure decode of `prompt`'s last token
        meta = metadata([(18, 1, a)], BLOCK)
        out = model.compute_logits(model(prompt[18:], torch.tensor([18]), kv, meta))
        torch.testing.assert_close(out[0], ref[18], atol=ATOL, rtol=0)


def test_old_style_rope_config_gives_same_logits(tiny_model_dir, tmp_path):
    """Published checkpoints write `rope_theta` + `rope_scaling`, not transformers-5 `rope_parameters`."""
    arch, overrides = VARIANTS["llama3-rope"]
    src = tiny_model_dir(arch, **overrides)
    for f in src.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((src / "config.json").read_text())
    params = cfg.pop("rope_parameters")
    cfg["rope_theta"] = params.pop("rope_theta")
    cfg["rope_scaling"] = params
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    new, spec = load_model(src)
    old, _ = load_model(tmp_path)
    assert old.rotary.inv_freq.tolist() == new.rotary.inv_freq.tolist()
    plain, _ = load_model(tiny_model_dir("llama"))
    assert old.rotary.inv_freq.tolist() != plain.rotary.inv_freq.tolist()  # scaling really applied
