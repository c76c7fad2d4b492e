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
from worker.batch.openai_input import LineError, parse_line
from worker.batch.resume import read_answered
from worker.cli import main

openai_types = pytest.importorskip("openai.types")
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
    job = parse_line(json.dumps(DOC_CHAT)).job
    assert job["messages"][1] == {"role": "user", "content": "Hello world!"} and job["max_tokens"] == 12
    job = parse_line(json.dumps(DOC_COMPLETION)).job
    assert (job["prompt"], job["temperature"]) == ("Once upon a time", 0)
    parts = _chat("p", max_completion_tokens=5)
    parts["body"]["messages"][0]["content"] = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    job = parse_line(json.dumps(parts)).job
    assert job["messages"][0]["content"] == "ab" and job["max_tokens"] == 5
    assert parse_line(json.dumps(_chat("x"))).job["id"] == parse_line(json.dumps(_chat("x"))).job["id"]
    for bad, code in [
        (_chat("t", tools=[{"type": "function"}]), "unsupported_field"),
        (_chat("s", stream=True), "unsupported_field"),
        (_chat("l", logprobs=True), "unsupported_field"),
        (_chat("b", logit_bias={"1": 2}), "unsupported_field"),
        ({**_chat("u"), "url": "/v1/embeddings"}, "invalid_url"),
        ({**DOC_COMPLETION, "body": {"prompt": ["a", "b"]}}, "invalid_request"),
    ]:
        with pytest.raises(LineError) as info:
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
    with running_worker(llm, redis_server.url):
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
    with running_worker(llm, redis_server.url):
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
