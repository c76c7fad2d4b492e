"""The default affinity key of a job: what a client puts in `affinity` when it gives none (docs/protocol.md,
"Affinity").

Jobs with the same key share a prompt prefix, so they are routed to the same shard and read first by that
shard's home worker, whose prefix cache holds the prefix. Any client computes the key without a tokenizer:

    text = job["prompt"]                                        (a prompt)
         = "".join(role + "\\n" + content + "\\n"                (messages: those before the last message
                   for each message before the last user one)    whose role is "user"; all if none is)
    key  = hex(sha256(utf8(text[:PREFIX_CHARS])))               (characters = Unicode code points)

No key when that text is empty (a single user message, an empty prompt) or the job has token ids: such
jobs share nothing the rule can see and are spread as jobs without a key are.

Multi-turn: turn k+1 of a conversation carries turn k's messages, the reply and a new user message; its
text is the conversation so far, so it gets the key of the conversation so far. Once that text is
PREFIX_CHARS long, every later turn has the same key, and the conversation stays on its home worker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

# Long enough to tell documents and system prompts apart, short enough that a conversation's key stops
# changing once its opening (a system prompt, a document) is written.
PREFIX_CHARS = 256


def affinity_text(job: Mapping[str, Any]) -> str | None:
    """The text the key is taken from, or None when the job has none (token ids, malformed fields: the
    worker refuses those later; a client must not fail on them here)."""
    prompt, messages = job.get("prompt"), job.get("messages")
    if isinstance(prompt, str):
        return prompt
    if not isinstance(messages, list):
        return None
    roles = [m.get("role") if isinstance(m, Mapping) else None for m in messages]
    before = max((i for i, role in enumerate(roles) if role == "user"), default=len(messages))
    parts = []
    for message in messages[:before]:
        if not isinstance(message, Mapping):
            return None
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            return None
        parts.append(f"{role}\n{content}\n")
    return "".join(parts)


def default_affinity(job: Mapping[str, Any]) -> str | None:
    """The key the rule gives `job` (64 lowercase hex digits), or None."""
    text = affinity_text(job)
    if not text:
        return None
    # surrogatepass: a lone surrogate (JSON allows "\ud800") must not make a client fail.
    return hashlib.sha256(text[:PREFIX_CHARS].encode("utf-8", "surrogatepass")).hexdigest()


def with_affinity(job: dict) -> dict:
    """`job` with its key set (a copy when one is added; the job itself when it has one or none applies)."""
    if job.get("affinity") is not None:
        return job
    key = default_affinity(job)
    return job if key is None else {**job, "affinity": key}
