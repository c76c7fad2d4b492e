"""The compile service (cache, timeout, killable child), the batch mask, preemption, the scheduler's wait state."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from engine import SamplingParams
from engine.structured.batch_mask import apply_grammar_masks
from engine.structured.compile_process import GrammarError
from engine.structured.spec import GrammarSpec
from tests.structured.schemas import SCHEMAS


def test_cached_compile_is_the_same_future_and_failures_are_cached(llm):
    service = llm.structured.service
    spec = GrammarSpec("regex", "[0-9]{4}")
    first = service.compile(spec)
    assert service.compile(spec) is first
    first.result(timeout=300)
    bad = service.compile(GrammarSpec("regex", "(unclosed"))
    with pytest.raises(GrammarError, match="parenthesis"):
        bad.result(timeout=300)
    assert service.compile(GrammarSpec("regex", "(unclosed")) is bad


def test_a_compile_past_its_timeout_is_killed_and_fails_only_its_request(llm):
    process = llm.structured.service.process
    llm.structured.service.compile(GrammarSpec("regex", "warm")).result(timeout=300)  # child started
    old_pid, saved = process._proc.pid, process.timeout_s
    process.timeout_s = 0  # poll without waiting: no compile has answered yet
    try:
        slow = SamplingParams(max_tokens=8, temperature=0, structured_outputs={"regex": "[a-f]{3}z"})
        llm.add_request("slow", "x", slow)
        llm.add_request("free", "y", SamplingParams(max_tokens=5, temperature=0, ignore_eos=True))
        finals = {}
        while llm.has_unfinished_requests():
            finals.update({d.request_id: d for d in llm.step() if d.finished})
    finally:
        process.timeout_s = saved
    assert finals["slow"].finish_reason == "abort" and "took longer" in finals["slow"].error
    assert finals["free"].finish_reason == "length" and finals["free"].error is None
    # The next compile starts a fresh child and works.
    out = llm.generate(
        ["x"], SamplingParams(max_tokens=8, temperature=0, structured_outputs={"regex": "[a-f]{2}y"})
    )
    assert out[0].finish_reason == "stop" and len(out[0].text) == 3
    assert process._proc.pid != old_pid


def test_mask_covers_lm_head_ids_past_the_tokenizer(llm):
    """An LM head wider than the tokenizer (Qwen: 152064 vs 151665): extra ids are never allowed."""
    from engine.structured.compiler import GrammarCompilerService

    vocab = len(llm.tokenizer)
    service = GrammarCompilerService(llm.tokenizer, vocab + 40, llm.eos_token_ids)
    try:
        import xgrammar as xgr

        compiled = service.compile(GrammarSpec("json_object", "")).result(timeout=300)
        matcher = xgr.GrammarMatcher(compiled)
        logits = torch.zeros(3, vocab + 64)  # [B, V_head + padding]
        apply_grammar_masks(logits, [(1, matcher)], vocab + 40)
        assert torch.isinf(logits[1, vocab:]).all()  # ids with no token, and the padding columns
        assert (logits[0] == 0).all() and (logits[2] == 0).all()  # free rows untouched
        allowed = torch.isfinite(logits[1]).nonzero().flatten().tolist()
        assert [llm.tokenizer.decode([t]) for t in allowed] and all(
            llm.tokenizer.decode([t]).lstrip().startswith(("{", "["))
            or llm.tokenizer.decode([t]).strip() == ""
            for t in allowed
        )
    finally:
        service.close()


def test_preempted_constrained_requests_end_in_the_same_valid_output(tiny_model_dir):
    from engine import LLMEngine

    names = ["defs_ref", "classification", "nested_object", "array_of_objects"]
    params = [
        SamplingParams(max_tokens=80, temperature=0, structured_outputs={"json": SCHEMAS[n]}) for n in names
    ]
    prompts = ["The quick brown fox jumps over the lazy dog"] * len(names)
    roomy = LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=256, block_size=8, device="cpu")
    tight = LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=14, block_size=8, device="cpu")
    try:
        expected = roomy.generate(prompts, params)
        got = tight.generate(prompts, params)
        assert tight.stats().num_preemptions > 0
        for name, a, b in zip(names, expected, got, strict=True):
            assert b.finish_reason == "stop" and b.token_ids == a.token_ids
            jsonschema.validate(json.loads(b.text), SCHEMAS[name])
    finally:
        roomy.structured.close()
        tight.structured.close()
