"""A job's `messages` reach the engine as messages: the engine renders the chat template and tokenizes it
once, so a template that writes BOS itself (Llama 3 and most others) does not get a second one."""

from __future__ import annotations

import pytest

from engine.tokenizer import encode_chat, load_tokenizer
from tests.helpers.worker_fakes import real_engine, running_worker
from worker.client import collect, enqueue

pytestmark = [pytest.mark.redis, pytest.mark.timeout(120)]

MESSAGES = [{"role": "user", "content": "Tell me about the sea."}]


def test_messages_job_counts_the_template_tokens_once(redis_server, r, tiny_model):
    tokenizer = load_tokenizer(tiny_model)
    ids = encode_chat(tokenizer, MESSAGES)
    assert ids[0] == tokenizer.bos_token_id and ids[1] != tokenizer.bos_token_id
    with running_worker(real_engine(tiny_model), redis_server.url):
        enqueue(r, {"id": "chat", "messages": MESSAGES, "max_tokens": 2, "temperature": 0})
        done = collect(r, "chat", timeout_s=60)[-1]
    assert done["type"] == "done", done
    assert done["usage"]["prompt_tokens"] == len(ids)
