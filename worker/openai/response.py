"""A job's done event -> OpenAI's `chat.completion` or `text_completion` body: the gateway's answer sent
whole, and a Batch output line's body."""

from __future__ import annotations

import time
from typing import Any

from worker.openai.echo import Echo, PromptScores, echo_choice
from worker.openai.logprobs import SampleLogprobs, chat_logprobs, completion_logprobs
from worker.openai.request import CHAT_URL
from worker.protocol import DoneEvent


def finish_reasons(done: DoneEvent) -> list[str]:
    """Per sample, in sample order."""
    return done.finish_reasons or [done.finish_reason]


def response_body(
    url: str,
    model: str,
    job_id: str,
    done: DoneEvent,
    logprobs: dict[int, SampleLogprobs] | None = None,
    echo: Echo | None = None,
    scores: PromptScores | None = None,
) -> dict[str, Any]:
    """`logprobs`: per sample, gathered from the token events, when the request asked for them; `echo`: a
    completions body's echo / prompt_logprobs, with the prompt's scores (echo.py)."""
    texts = done.texts or [done.text]
    prompt, completion = done.usage.prompt_tokens, done.usage.completion_tokens
    chat = url == CHAT_URL
    choices: list[dict[str, Any]] = []
    for k, (text, reason) in enumerate(zip(texts, finish_reasons(done), strict=True)):
        shown = None
        if logprobs is not None:
            sample = logprobs.get(k, SampleLogprobs())
            shown = chat_logprobs(sample) if chat else completion_logprobs(sample)
        if chat:
            message = {"role": "assistant", "content": text}
            choices.append({"index": k, "message": message, "finish_reason": reason, "logprobs": shown})
        else:
            choice = {"index": k, "text": text, "finish_reason": reason, "logprobs": shown}
            choices.append(choice if echo is None else echo_choice(echo, choice, scores))
    if echo is not None and echo.only:
        completion = 0  # the one token generated to score the prompt is not shown
    return {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-{job_id}",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        },
    }
