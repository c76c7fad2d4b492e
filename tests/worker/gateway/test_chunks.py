"""The streamed chunks: a chunk is byte for byte the compact JSON of its whole dict (and one of OpenAI's
chunk types); each batch of events is one body; [DONE] ends the last."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletionChunk

from tests.helpers.events import as_event
from worker.gateway.chunks import DONE, ChunkEncoder
from worker.openai.logprobs import SampleLogprobs, completion_logprobs
from worker.openai.request import CHAT_URL, COMPLETIONS_URL

TRICKY = [
    "",
    "plain",
    ' "quoted" ',
    "back\\slash \\n not a newline",
    "new\nline\ttab\r\b\f",
    "\x00\x01\x1f\x7f controls",
    "é ü ß 中文 русский",
    "emoji 🤖👍🏽 and a flag 🇫🇷",
    "\u2028\u2029 separators",
    "</script><!-- -->",
    '{"not": "json"}',
]


def _writer(url: str, include_usage: bool = True, model: str = "tiny") -> ChunkEncoder:
    return ChunkEncoder(url, "job-1", model, 3, include_usage, 30.0, created=1700000000)


def _expected(url: str, text: str, sample: int, logprobs, include_usage: bool) -> dict:
    chat = url == CHAT_URL
    if chat:
        choice = {"index": sample, "delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
    else:
        choice = {"index": sample, "text": text, "logprobs": logprobs, "finish_reason": None}
    body = {
        "id": f"{'chatcmpl' if chat else 'cmpl'}-job-1",
        "object": "chat.completion.chunk" if chat else "text_completion",
        "created": 1700000000,
        "model": "tiny",
        "choices": [choice],
    }
    if include_usage:
        body["usage"] = None
    return body


def _sse(body: dict) -> bytes:
    return b"data: " + json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode() + b"\n\n"


@pytest.mark.parametrize("url", [CHAT_URL, COMPLETIONS_URL])
@pytest.mark.parametrize("include_usage", [True, False])
@pytest.mark.parametrize("text", TRICKY)
def test_a_token_chunk_is_the_json_of_its_whole_dict(url, include_usage, text):
    writer = _writer(url, include_usage)
    for sample in (None, 2):
        event = {"type": "token", "index": 0, "token_ids": [5], "text": text}
        if sample is not None:
            event["sample"] = sample
        piece = writer.token(as_event(event))
        if not text:
            assert piece is None  # held back: nothing to show
            continue
        expected = _expected(url, text, sample or 0, None, include_usage)
        assert piece == _sse(expected)
        parsed = json.loads(piece.removeprefix(b"data: "))
        assert parsed == expected
        if (
            url == CHAT_URL
        ):  # (the SDK's Completion type wants a finish reason: it builds streamed ones unchecked)
            ChatCompletionChunk.model_validate(parsed)


def _logprobs_event(text: str, pieces: list[str], logprobs: list[float], **extra):
    listed = [[7 + k, lp] for k, lp in enumerate(logprobs)]
    return as_event({"type": "token", "index": 3, "token_ids": [7], "text": text, "logprobs": [listed],
                     "logprob_tokens": [pieces], **extra})  # fmt: skip


def _shown(url: str, pieces: list[str], logprobs: list[float]) -> dict:
    """The choice's `logprobs` for one token listed with its alternatives, in the route's shape."""
    if url == CHAT_URL:

        def entry(p, lp):
            return {"token": p, "logprob": lp, "bytes": list(p.encode())}

        alternatives = [entry(p, lp) for p, lp in zip(pieces[1:], logprobs[1:], strict=True)]
        return {"content": [{**entry(pieces[0], logprobs[0]), "top_logprobs": alternatives}], "refusal": None}
    return {
        "tokens": [pieces[0]],
        "token_logprobs": [logprobs[0]],
        "top_logprobs": [dict(zip(pieces[1:], logprobs[1:], strict=True))],
        "text_offset": [0],
    }


@pytest.mark.parametrize("url", [CHAT_URL, COMPLETIONS_URL])
@pytest.mark.parametrize("text", ["", 'a "b" \\ 🤖', "\x00\n"])
# -inf (a token that cannot be sampled) is written -Infinity, as the answer sent whole writes it
@pytest.mark.parametrize("last", [float("-inf"), -3.75, -1.1920928955078125e-07])
def test_a_token_chunk_with_logprobs(url, text, last):
    writer = _writer(url)
    pieces, logprobs = [text or "\ufffd", '"', "\\"], [-0.25, -1.5, last]
    piece = writer.token(_logprobs_event(text, pieces, logprobs))
    assert piece is not None  # logprobs are shown even while the text is held back
    assert piece == _sse(_expected(url, text, 0, _shown(url, pieces, logprobs), True))


def test_streamed_text_offsets_count_from_the_start_of_each_sample_s_text():
    # As the answer sent whole counts them (one SampleLogprobs over all of a sample's events).
    writer = _writer(COMPLETIONS_URL)
    two = {"type": "token", "index": 1, "token_ids": [7, 8], "text": "", "sample": 0,  # text held back
           "logprobs": [[[7, -0.25]], [[8, -1.0]]], "logprob_tokens": [["\ufffd"], ["c"]]}  # fmt: skip
    events = [
        _logprobs_event("ab", ["ab"], [-0.5], sample=0),
        _logprobs_event("xyz", ["xyz"], [-0.5], sample=1),
        as_event(two),
        _logprobs_event("d", ["d"], [-0.5], sample=0),
    ]
    streamed: dict[int, list[int]] = {0: [], 1: []}
    for event in events:
        choice = json.loads(writer.token(event).removeprefix(b"data: "))["choices"][0]
        streamed[choice["index"]] += choice["logprobs"]["text_offset"]
    for k in (0, 1):
        whole = SampleLogprobs()
        for event in events:
            if event.sample == k:
                whole.add(event)
        assert streamed[k] == completion_logprobs(whole)["text_offset"]
    assert streamed == {0: [0, 2, 3, 4], 1: [0]}


@pytest.mark.parametrize("url", [CHAT_URL, COMPLETIONS_URL])
@pytest.mark.parametrize("include_usage", [True, False])
def test_the_ending_chunks_are_the_json_of_their_whole_dicts(url, include_usage):
    """A choice's last chunk (its finish reason) and the usage chunk."""
    writer = _writer(url, include_usage)
    done = as_event({"type": "done", "finish_reason": "stop", "finish_reasons": ["stop", "length", "stop"],
                     "usage": {"prompt_tokens": 7, "completion_tokens": 1234}})  # fmt: skip
    pieces = writer.ending(done)
    expected = []
    for k, why in enumerate(["stop", "length", "stop"]):
        body = _expected(url, "", k, None, include_usage)
        if url == CHAT_URL:
            body["choices"][0]["delta"] = {}
        body["choices"][0]["finish_reason"] = why
        expected.append(body)
    if include_usage:
        usage = {"prompt_tokens": 7, "completion_tokens": 1234, "total_tokens": 1241}
        expected.append({**_expected(url, "", 0, None, True), "choices": [], "usage": usage})
    assert pieces == [_sse(body) for body in expected]


def _token(k: int, text: str):
    return as_event({"type": "token", "index": k, "token_ids": [k], "text": text})


def _done():
    return as_event(
        {"type": "done", "finish_reason": "length", "usage": {"prompt_tokens": 4, "completion_tokens": 3}}
    )


def _bodies(writer: ChunkEncoder, batches: list, expires: bool = False) -> list[bytes]:
    """The bodies sent for the batches, as EventStream sends them (an empty one is not sent), and the
    expired stream's last body when `expires`."""
    bodies = []
    for k, batch in enumerate(batches):
        body, last = writer.body(batch, first=k == 0)
        if body or last:
            bodies.append(body)
        if last:
            assert k == len(batches) - 1  # nothing is read after the terminal event
            return bodies
    assert expires  # a stream ends at its terminal event or at its deadline
    return [*bodies, writer.expired()]


def test_each_batch_of_events_is_one_body_and_the_last_ends_with_done():
    writer = ChunkEncoder(CHAT_URL, "job-1", "tiny", 1, True, 30.0)
    batches = [[_token(0, "a")], [_token(1, "b"), _token(2, ""), _token(3, "c")], [_done()]]
    bodies = _bodies(writer, batches)
    opening, a = writer.opening(), writer.token(batches[0][0])
    b, c = writer.token(batches[1][0]), writer.token(batches[1][2])
    assert bodies == [b"".join([*opening, a]), b + c, b"".join(writer.ending(_done())) + DONE]
    events = [e for body in bodies for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and len(events) == 1 + 3 + 2 + 1  # usage chunk included


def test_the_terminal_event_in_a_batch_ends_the_stream_in_that_body():
    writer = ChunkEncoder(COMPLETIONS_URL, "job-1", "tiny", 1, False, 30.0)
    bodies = _bodies(writer, [[_token(0, "a"), _token(1, "b"), _done()]])
    assert len(bodies) == 1 and bodies[0].endswith(b'"finish_reason":"length"}]}\n\n' + DONE)


def test_a_timeout_while_following_is_an_error_chunk_then_done():
    writer = ChunkEncoder(COMPLETIONS_URL, "job-1", "tiny", 1, False, 30.0)
    bodies = _bodies(writer, [[_token(0, "a")]], expires=True)
    assert bodies[0] == writer.token(_token(0, "a"))
    error = json.loads(bodies[1].removesuffix(DONE).removeprefix(b"data: "))
    assert error["error"]["code"] == "timeout" and bodies[1].endswith(DONE)


def test_a_worker_error_is_an_error_chunk_then_done():
    writer = ChunkEncoder(CHAT_URL, "job-1", "tiny", 1, False, 30.0)
    failed = as_event({"type": "error", "code": "internal", "message": "it broke"})
    bodies = _bodies(writer, [[_token(0, "a")], [failed]])
    error = json.loads(bodies[1].removesuffix(DONE).removeprefix(b"data: "))
    assert error["error"]["message"] and bodies[1].endswith(DONE) and len(bodies) == 2
