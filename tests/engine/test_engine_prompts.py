"""The engine owns templating and tokenizing: text, token ids and chat messages in, one BOS, and the
prompt-length limits as engine options that reject with a reason code."""

from __future__ import annotations

import pytest

from engine import Chat, LLMEngine, RejectReason, RequestRejected, SamplingParams
from engine.tokenizer import render_chat

HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def llm(tiny_model_dir) -> LLMEngine:
    return LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=64, dtype="float32", device="cpu")


def _prompt_ids(llm: LLMEngine, prompt) -> list[int]:
    (out,) = llm.generate([prompt], SamplingParams(max_tokens=1, temperature=0))
    return out.prompt_token_ids


def test_chat_starts_with_exactly_one_bos(llm):
    bos = llm.tokenizer.bos_token_id
    text = render_chat(llm.tokenizer, HI)
    # The tiny model's template writes BOS itself, like Llama 3's: encoding its text with the tokenizer's
    # special tokens would start the prompt with BOS twice.
    assert text.startswith(llm.tokenizer.bos_token)
    ids = _prompt_ids(llm, Chat(HI))
    assert ids[0] == bos and ids[1] != bos
    assert ids == llm.tokenizer.encode(text, add_special_tokens=False)


def test_text_gets_one_bos_and_ids_are_used_as_given(llm):
    ids = _prompt_ids(llm, "hello")
    assert ids[0] == llm.tokenizer.bos_token_id and ids[1] != llm.tokenizer.bos_token_id
    assert _prompt_ids(llm, [7, 8, 9]) == [7, 8, 9]


def test_messages_without_a_chat_template_are_rejected(tiny_model_dir):
    plain = LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=8, device="cpu")
    plain.tokenizer.chat_template = None
    with pytest.raises(RequestRejected, match="no chat template") as rejected:
        plain.add_request("c", Chat(HI))
    assert rejected.value.reason is RejectReason.NO_CHAT_TEMPLATE
    assert not plain.has_unfinished_requests()


def test_messages_the_template_cannot_render_are_rejected(llm, monkeypatch):
    # Templates refuse what they cannot render with raise_exception (e.g. roles that do not alternate).
    monkeypatch.setattr(llm.tokenizer, "chat_template", "{{ raise_exception('roles must alternate') }}")
    with pytest.raises(RequestRejected, match="messages: roles must alternate") as rejected:
        llm.add_request("m", Chat(HI))
    assert rejected.value.reason is RejectReason.BAD_MESSAGES
    assert not llm.has_unfinished_requests()


@pytest.mark.parametrize("as_ids", [False, True])
def test_max_prompt_tokens_is_an_engine_option(tiny_model_dir, as_ids):
    capped = LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=64, max_prompt_tokens=5, device="cpu")
    assert capped.max_prompt_tokens == 5
    long = [5] * 6 if as_ids else "one two three four five six seven"
    with pytest.raises(RequestRejected, match="prompt has .* tokens, the limit is 5") as rejected:
        capped.add_request("long", long, SamplingParams(max_tokens=1))
    assert rejected.value.reason is RejectReason.PROMPT_TOO_LONG
    assert capped.add_request("short", [5] * 5, SamplingParams(max_tokens=1)) == 5


def test_prompt_must_leave_room_for_one_token(tiny_model_dir):
    short = LLMEngine(str(tiny_model_dir("llama")), num_kv_blocks=64, max_model_len=32, device="cpu")
    assert short.max_prompt_tokens == 31
    with pytest.raises(RequestRejected) as rejected:
        short.add_request("full", [5] * 32, SamplingParams(max_tokens=1))
    assert rejected.value.reason is RejectReason.PROMPT_TOO_LONG
    # A prompt that fits, but not with its max_tokens, is a different refusal.
    with pytest.raises(RequestRejected) as rejected:
        short.add_request("fits", [5] * 30, SamplingParams(max_tokens=8))
    assert rejected.value.reason is RejectReason.TOO_LONG_FOR_MODEL
