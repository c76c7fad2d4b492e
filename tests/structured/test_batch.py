"""`conveyor batch`: OpenAI Batch files through Redis and a real worker; output parsed with openai's types."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter

import jsonschema
import pytest
from click.testing import CliRunner

from tests.helpers.worker_fakes import running_worker
from tests.structured.schemas import SCHEMAS
from worker.batch.input_line import parse_line
from worker.batch.resume import read_answered
from worker.cli.main import main
from worker.intake.limits import Limits
from worker.openai.request import RequestError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# The two examples of OpenAI's Batch guide, as written there (max_tokens cut to keep the test fast).
DOC_CHAT = {
    "custom_id": "request-1",
    "method": "POST",
    "url": "/v1/chat/completions",
    "body": {
        "model": "gpt-3.5-turbo-0125",
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Hello world!"},
        ],
        "max_tokens": 12,
    },
}
DOC_COMPLETION = {
    "custom_id": "request-2",
    "method": "POST",
    "url": "/v1/completions",
    "body": {
        "model": "gpt-3.5-turbo-instruct",
        "prompt": "Once upon a time",
        "max_tokens": 10,
        "temperature": 0,
    },
}


# The models the lines name: `conveyor batch` sends each line to its model's live workers.
SERVED = ("m", DOC_CHAT["body"]["model"], DOC_COMPLETION["body"]["model"])


def _chat(custom_id: str, **body) -> dict:
    messages = [{"role": "user", "content": f"Say something ({custom_id})"}]
    return {
        "custom_id": custom_id,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {"model": "m", "messages": messages, "max_tokens": 8, **body},
    }


def _write(path, entries) -> None:
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in entries))


def _read(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_line_mapping_and_refusals():
    job = parse_line(json.dumps(DOC_CHAT)).job.wire()
    assert job["messages"][1] == {"role": "user", "content": "Hello world!"} and job["max_tokens"] == 12
    job = parse_line(json.dumps(DOC_COMPLETION)).job.wire()
    assert (job["prompt"], job["temperature"]) == ("Once upon a time", 0)
    parts = _chat("p", max_completion_tokens=5)
    parts["body"]["messages"][0]["content"] = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    job = parse_line(json.dumps(parts)).job.wire()
    assert job["messages"][0]["content"] == "ab" and job["max_tokens"] == 5
    assert parse_line(json.dumps(_chat("lp", logprobs=True, top_logprobs=3))).job.wire()["logprobs"] == 3
    assert parse_line(json.dumps(_chat("lp", logprobs=True))).job.wire()["logprobs"] == 0
    assert "logprobs" not in parse_line(json.dumps(_chat("lp", logprobs=False))).job.wire()
    assert (
        parse_line(json.dumps({**DOC_COMPLETION, "body": {"prompt": "a", "logprobs": 2}})).job.wire()[
            "logprobs"
        ]
        == 2
    )
    # No max_tokens: OpenAI's "up to the model's context", an explicit null in the job (not the engine's 16).
    unbounded = dict(DOC_CHAT, body={k: v for k, v in DOC_CHAT["body"].items() if k != "max_tokens"})
    job = parse_line(json.dumps(unbounded)).job.wire()
    assert "max_tokens" in job and job["max_tokens"] is None
    assert (
        parse_line(json.dumps(_chat("x"))).job.wire()["id"]
        == parse_line(json.dumps(_chat("x"))).job.wire()["id"]
    )
    for bad, code in [
        (_chat("t", tools=[{"type": "function"}]), "unsupported_field"),
        (_chat("s", stream=True), "unsupported_field"),
        (_chat("l", top_logprobs=2), "invalid_request"),  # top_logprobs without logprobs: true
        (_chat("k", logprobs=True, top_logprobs=21), "invalid_request"),
        (_chat("b", logit_bias={"1": 2}), "unsupported_field"),
        ({**_chat("u"), "url": "/v1/embeddings"}, "invalid_url"),
        ({**DOC_COMPLETION, "body": {"prompt": ["a", "b"]}}, "invalid_request"),
    ]:
        with pytest.raises(RequestError) as info:
            parse_line(json.dumps(bad))
        assert info.value.code == code


def test_a_partial_last_line_is_cut_before_resuming(tmp_path):
    out = tmp_path / "out.jsonl"
    out.write_text('{"custom_id": "a", "error": null}\n{"custom_id": "b", "resp')
    assert read_answered(str(out)).custom_ids == {"a"}
    assert out.read_text() == '{"custom_id": "a", "error": null}\n'


@pytest.mark.redis
@pytest.mark.timeout(300)
def test_openai_batch_file_end_to_end(redis_server, r, llm, tmp_path):
    # A test extra: imported here, so that collecting the module needs only the core packages.
    from openai import types as openai_types

    schema = SCHEMAS["classification"]
    fmt = {"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}}
    entries = [
        DOC_CHAT,
        DOC_COMPLETION,
        _chat("json", response_format=fmt, max_tokens=96, temperature=0),
        _chat("n2", n=2, temperature=0.8, seed=3),
        _chat("tools", tools=[{"type": "function", "function": {"name": "f"}}]),
        _chat(
            "bad-schema",
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        ),
        _chat("json"),  # a duplicate custom_id
        "this is not json",
    ]
    inp, out, err = tmp_path / "in.jsonl", tmp_path / "out.jsonl", tmp_path / "errors.jsonl"
    _write(inp, entries)
    with running_worker(llm, redis_server.url, served=SERVED):
        result = CliRunner().invoke(
            main,
            [
                "batch",
                "-i",
                str(inp),
                "-o",
                str(out),
                "--errors-file",
                str(err),
                "--redis-url",
                redis_server.url,
            ],
        )
    assert result.exit_code == 0, result.output
    lines = _read(out)
    assert len(lines) == len(entries)
    by_id = {}
    for line in lines:
        assert set(line) == {"id", "custom_id", "response", "error"}
        by_id.setdefault(line["custom_id"], []).append(line)
        response = line["response"]
        if response is not None and response["status_code"] == 200:
            body = response["body"]
            kind = (
                openai_types.chat.ChatCompletion
                if body["object"] == "chat.completion"
                else openai_types.Completion
            )
            kind.model_validate(body)
            assert body["usage"]["completion_tokens"] > 0
    answers = {
        line["custom_id"]: line
        for line in lines
        if line["error"] is None or line["error"]["code"] != "duplicate_custom_id"
    }
    assert len(answers) == len(entries) - 1  # one line per custom_id, plus the duplicate's error line
    ok = {
        c: line["response"]["body"]
        for c, line in answers.items()
        if line["response"] and line["response"]["status_code"] == 200
    }
    assert set(ok) == {"request-1", "request-2", "json", "n2"}
    jsonschema.validate(json.loads(ok["json"]["choices"][0]["message"]["content"]), schema)
    assert len(ok["n2"]["choices"]) == 2 and ok["request-2"]["object"] == "text_completion"
    assert answers["tools"]["error"]["code"] == "unsupported_field"
    bad = answers["bad-schema"]["response"]
    assert bad["status_code"] == 400 and bad["body"]["error"]["code"] == "invalid_params"
    assert "nope" in bad["body"]["error"]["message"]
    assert sorted(str(line["error"] and line["error"]["code"]) for line in by_id["json"]) == [
        "None",
        "duplicate_custom_id",
    ]
    assert len(_read(err)) == 4  # tools, bad-schema, duplicate, not json


@pytest.mark.redis
@pytest.mark.timeout(600)
def test_killed_mid_file_and_rerun_answers_each_custom_id_once(redis_server, r, llm, tmp_path):
    entries = [_chat(f"c{i}", max_tokens=6 + i % 5, temperature=0) for i in range(14)]
    entries.append(_chat("c3"))  # duplicate: one error line, not repeated by the rerun
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, entries)
    args = ["batch", "-i", str(inp), "-o", str(out), "--redis-url", redis_server.url, "--max-in-flight", "2"]
    env = {**os.environ, "PYTHONPATH": ROOT}
    with running_worker(llm, redis_server.url, served=SERVED):
        proc = subprocess.Popen(
            [sys.executable, "-m", "worker.cli", *args, "--no-progress"], cwd=ROOT, env=env
        )
        try:
            # Wait for a condition, not a duration: a few lines written, the rest not yet.
            while not out.exists() or len(out.read_text().splitlines()) < 3:
                try:
                    proc.wait(timeout=0.05)
                    break  # it ended by itself: the assertion below reports it
                except subprocess.TimeoutExpired:
                    pass
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        written = len(out.read_text().splitlines())
        assert 3 <= written < len(entries), "the first run must be cut mid-file"
        result = CliRunner().invoke(main, [*args, "--no-progress"])
        assert result.exit_code == 0, result.output
    lines = _read(out)
    counts = Counter(line["custom_id"] for line in lines if line["error"] is None)
    assert counts == Counter({f"c{i}": 1 for i in range(14)})
    assert [line["custom_id"] for line in lines if line["error"] is not None] == ["c3"]
    assert all(line["response"]["status_code"] == 200 for line in lines if line["error"] is None)


def _run_batch(url: str, entries: list, tmp_path) -> dict[str, dict]:
    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    _write(inp, entries)
    result = CliRunner().invoke(main, ["batch", "-i", str(inp), "-o", str(out), "--redis-url", url])
    assert result.exit_code == 0, result.output
    return {line["custom_id"]: line for line in _read(out)}


# ASCII-only output, so that every token's piece is whole characters and the pieces join to the text.
WORDS = {"regex": "[a-z]{4,10}( [a-z]{2,9}){3}"}


@pytest.mark.redis
@pytest.mark.timeout(300)
def test_logprobs_in_openai_shapes_join_to_the_text(redis_server, r, llm, tmp_path):
    # A test extra: imported here, so that collecting the module needs only the core packages.
    from openai import types as openai_types

    entries = [
        _chat("chat", logprobs=True, top_logprobs=3, structured_outputs=WORDS, max_tokens=40, temperature=0),
        {
            "custom_id": "cmpl",
            "method": "POST",
            "url": "/v1/completions",
            "body": {
                "prompt": "Once",
                "logprobs": 2,
                "n": 2,
                "temperature": 0.9,
                "seed": 5,
                "max_tokens": 40,
                "structured_outputs": WORDS,
            },
        },
        _chat("plain", max_tokens=4, temperature=0),
    ]
    with running_worker(llm, redis_server.url, served=SERVED):
        lines = _run_batch(redis_server.url, entries, tmp_path)
    chat = openai_types.chat.ChatCompletion.model_validate(lines["chat"]["response"]["body"])
    choice = chat.choices[0]
    assert choice.logprobs is not None and choice.logprobs.content
    content = choice.logprobs.content
    assert "".join(t.token for t in content) == choice.message.content
    assert len(content) == chat.usage.completion_tokens
    for t in content:
        assert len(t.top_logprobs) == 3 and bytes(t.bytes) == t.token.encode()
        assert t.logprob <= 0 and max(a.logprob for a in t.top_logprobs) >= t.logprob - 1e-4
    cmpl = openai_types.Completion.model_validate(lines["cmpl"]["response"]["body"])
    assert len(cmpl.choices) == 2
    for c in cmpl.choices:
        lp = c.logprobs
        assert lp is not None and "".join(lp.tokens) == c.text and len(lp.token_logprobs) == len(lp.tokens)
        assert lp.text_offset == [len("".join(lp.tokens[:i])) for i in range(len(lp.tokens))]
        assert all(len(top) <= 2 for top in lp.top_logprobs) and any(len(top) == 2 for top in lp.top_logprobs)
    plain = lines["plain"]["response"]["body"]["choices"][0]
    assert plain["logprobs"] is None


@pytest.mark.redis
@pytest.mark.timeout(300)
def test_a_line_without_max_tokens_runs_to_its_end_not_to_16_tokens(redis_server, r, llm, tmp_path):
    long_words = {"regex": "[a-z]{48}"}  # the grammar forbids EOS until 48 letters: more than 16 tokens
    entries = [_chat("free", structured_outputs=long_words, temperature=0)]
    entries[0]["body"].pop("max_tokens")
    with running_worker(llm, redis_server.url, served=SERVED):
        body = _run_batch(redis_server.url, entries, tmp_path)["free"]["response"]["body"]
    assert (
        body["choices"][0]["finish_reason"] == "stop" and len(body["choices"][0]["message"]["content"]) == 48
    )
    assert body["usage"]["completion_tokens"] > 16
    # A worker's --max-tokens-limit caps "until the context is full" instead of refusing the job.
    (tmp_path / "capped").mkdir()
    entries[0]["custom_id"] = "capped"  # another line, so another job id (ids derive from the line)
    with running_worker(llm, redis_server.url, served=SERVED, limits=Limits(max_tokens=5)):
        body = _run_batch(redis_server.url, entries, tmp_path / "capped")["capped"]["response"]["body"]
    assert body["choices"][0]["finish_reason"] == "length" and body["usage"]["completion_tokens"] == 5
