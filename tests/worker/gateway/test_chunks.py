"""The streamed chunks: a token's chunk, spliced from a template, is byte for byte the JSON of the chunk's
whole dict (and one of OpenAI's chunk types); each batch of events is one body; [DONE] ends the last."""

from __future__ import annotations

import json

import pytest
from openai.types.chat import ChatCompletionChunk

from worker.batch.openai_input import CHAT_URL, COMPLETIONS_URL
from worker.batch.openai_logprobs import SampleLogprobs, completion_logprobs
from worker.gateway.chunks import ChunkWriter
from worker.gateway.sse import DONE, hole, sse_template

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


def _writer(url: str, include_usage: bool = True, model: str = "tiny") -> ChunkWriter:
    return ChunkWriter(url, "job-1", model, 3, include_usage, 30.0, created=1700000000)


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
        piece = writer.token(event)
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


def _logprobs_event(text: str, pieces: list[str], logprobs: list[float]) -> dict:
    listed = [[7 + k, lp] for k, lp in enumerate(logprobs)]
    return {"type": "token", "index": 3, "token_ids": [7], "text": text, "logprobs": [listed],
            "logprob_tokens": [pieces]}  # fmt: skip


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
# -inf (a token that cannot be sampled) takes Python's json (-Infinity); finite ones orjson, the same bytes
@pytest.mark.parametrize("last", [float("-inf"), -3.75])
def test_a_token_chunk_with_logprobs(url, text, last):
    writer = _writer(url)
    pieces, logprobs = [text or "\ufffd", '"', "\\"], [-0.25, -1.5, last]
    piece = writer.token(_logprobs_event(text, pieces, logprobs))
    assert piece is not None  # logprobs are shown even while the text is held back
    assert piece == _sse(_expected(url, text, 0, _shown(url, pieces, logprobs), True))


@pytest.mark.parametrize("url", [CHAT_URL, COMPLETIONS_URL])
def test_finite_logprobs_written_by_orjson_read_back_the_same(url):
    # orjson writes an exponent unpadded (e-7, where json writes e-07): other bytes, the same values.
    pieces, logprobs = ["a", "b"], [-1.1920928955078125e-07, -0.5]
    piece = _writer(url).token(_logprobs_event("a", pieces, logprobs))
    assert b"-1.1920928955078125e-7" in piece
    assert json.loads(piece.removeprefix(b"data: ")) == _expected(
        url, "a", 0, _shown(url, pieces, logprobs), True
    )


def test_streamed_text_offsets_count_from_the_start_of_each_sample_s_text():
    # As the answer sent whole counts them (one SampleLogprobs over all of a sample's events).
    writer = _writer(COMPLETIONS_URL)
    events = [
        {**_logprobs_event("ab", ["ab"], [-0.5]), "sample": 0},
        {**_logprobs_event("xyz", ["xyz"], [-0.5]), "sample": 1},
        {**_logprobs_event("", ["\ufffd", "c"], [-0.25, -1.0]), "sample": 0},  # text held back
        {**_logprobs_event("d", ["d"], [-0.5]), "sample": 0},
    ]
    events[2]["logprobs"], events[2]["logprob_tokens"] = [[[7, -0.25]], [[8, -1.0]]], [["\ufffd"], ["c"]]
    streamed: dict[int, list[int]] = {0: [], 1: []}
    for event in events:
        choice = json.loads(writer.token(event).removeprefix(b"data: "))["choices"][0]
        streamed[choice["index"]] += choice["logprobs"]["text_offset"]
    for k in (0, 1):
        whole = SampleLogprobs()
        for event in events:
            if event["sample"] == k:
                whole.add(event)
        assert streamed[k] == completion_logprobs(whole)["text_offset"]
    assert streamed == {0: [0, 2, 3, 4], 1: [0]}


@pytest.mark.parametrize("url", [CHAT_URL, COMPLETIONS_URL])
@pytest.mark.parametrize("include_usage", [True, False])
def test_the_ending_chunks_are_the_json_of_their_whole_dicts(url, include_usage):
    """A choice's last chunk (its finish reason) and the usage chunk, spliced from templates too."""
    writer = _writer(url, include_usage)
    done = {"type": "done", "finish_reason": "stop", "finish_reasons": ["stop", "length", "stop"],
            "usage": {"prompt_tokens": 7, "completion_tokens": 1234}}  # fmt: skip
    pieces = writer.ending(done)
    expected = []
    for k, why in enumerate(done["finish_reasons"]):
        body = _expected(url, "", k, None, include_usage)
        if url == CHAT_URL:
            body["choices"][0]["delta"] = {}
        body["choices"][0]["finish_reason"] = why
        expected.append(body)
    if include_usage:
        usage = {"prompt_tokens": 7, "completion_tokens": 1234, "total_tokens": 1241}
        expected.append({**_expected(url, "", 0, None, True), "choices": [], "usage": usage})
    assert pieces == [_sse(body) for body in expected]


def test_a_model_name_that_looks_like_a_hole_stays_a_name():
    # A client chooses the model name; the template's holes are not guessable from outside.
    writer = _writer(COMPLETIONS_URL, model='\x00hole1\x00 "tiny"')
    piece = writer.token({"type": "token", "index": 0, "token_ids": [1], "text": "x"})
    assert json.loads(piece.removeprefix(b"data: "))["model"] == '\x00hole1\x00 "tiny"'


def test_a_template_needs_each_hole_in_order():
    assert sse_template({"a": hole(0), "b": [hole(1)]}, 2) == [b'data: {"a":', b',"b":[', b"]}\n\n"]
    with pytest.raises(ValueError):
        sse_template({"a": hole(1), "b": hole(0)}, 2)
    with pytest.raises(ValueError):
        sse_template({"a": hole(0)}, 2)


def _token(k: int, text: str) -> dict:
    return {"type": "token", "index": k, "token_ids": [k], "text": text}


def _done() -> dict:
    usage = {"prompt_tokens": 4, "completion_tokens": 3}
    return {"type": "done", "finish_reason": "length", "usage": usage}


def _bodies(writer: ChunkWriter, batches: list[list[dict]], expires: bool = False) -> list[bytes]:
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
    writer = ChunkWriter(CHAT_URL, "job-1", "tiny", 1, True, 30.0)
    batches = [[_token(0, "a")], [_token(1, "b"), _token(2, ""), _token(3, "c")], [_done()]]
    bodies = _bodies(writer, batches)
    opening, a = writer.opening(), writer.token(batches[0][0])
    b, c = writer.token(batches[1][0]), writer.token(batches[1][2])
    assert bodies == [b"".join([*opening, a]), b + c, b"".join(writer.ending(_done())) + DONE]
    events = [e for body in bodies for e in body.split(b"\n\n") if e]
    assert events[-1] == b"data: [DONE]" and len(events) == 1 + 3 + 2 + 1  # usage chunk included


def test_the_terminal_event_in_a_batch_ends_the_stream_in_that_body():
    writer = ChunkWriter(COMPLETIONS_URL, "job-1", "tiny", 1, False, 30.0)
    bodies = _bodies(writer, [[_token(0, "a"), _token(1, "b"), _done()]])
    assert len(bodies) == 1 and bodies[0].endswith(b'"finish_reason":"length"}]}\n\n' + DONE)


def test_a_timeout_while_following_is_an_error_chunk_then_done():
    writer = ChunkWriter(COMPLETIONS_URL, "job-1", "tiny", 1, False, 30.0)
    bodies = _bodies(writer, [[_token(0, "a")]], expires=True)
    assert bodies[0] == writer.token(_token(0, "a"))
    error = json.loads(bodies[1].removesuffix(DONE).removeprefix(b"data: "))
    assert error["error"]["code"] == "timeout" and bodies[1].endswith(DONE)


def test_a_worker_error_is_an_error_chunk_then_done():
    writer = ChunkWriter(CHAT_URL, "job-1", "tiny", 1, False, 30.0)
    failed = {"type": "error", "code": "internal", "message": "it broke"}
    bodies = _bodies(writer, [[_token(0, "a")], [failed]])
    error = json.loads(bodies[1].removesuffix(DONE).removeprefix(b"data: "))
    assert error["error"]["message"] and bodies[1].endswith(DONE) and len(bodies) == 2
