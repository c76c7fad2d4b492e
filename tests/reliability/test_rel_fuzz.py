"""Issue #5: thousands of malformed and hostile payloads at a live worker process while valid jobs flow.

The worker must stay up, every valid job must come out exactly once and equal to the engine's own output,
and every bad entry must be dead-lettered exactly once with its error code and a reason (plus an error
event on its output stream when the payload named a usable id). Payloads come from a seeded generator
and are pipelined in batches, so the run is reproducible and bounded.
"""

from __future__ import annotations

import json
import random
import time

import pytest

from tests.helpers.rel_helpers import (
    GROUP,
    K,
    assert_exactly_once,
    enqueue_many,
    expected_outputs,
    read_events,
    wait_terminal,
    wait_until,
)
from worker.intake.json_scan import MAX_JSON_DEPTH
from worker.keys import JOB_FIELD

pytestmark = [pytest.mark.redis]

LIMITS = ("--max-payload-bytes", "65536", "--max-prompt-tokens", "64", "--max-tokens-limit", "32")
N_BAD = 2400
ODD_IDS = [
    "", " ", "a b", "x" * 129, "../../etc/passwd", "id\x00nul", "é", "*", "?", "{}", "a/b", "a\\b",
    "$(rm -rf /)", "<script>", "\u202eevil", "tab\tid", "%s%n", "conveyor:out:*", "☃", "\ud800",
]  # fmt: skip
JSON_FIELD_JUNK = [None, True, -1, 1.5, "str", [], {}, [1, "a"], {"a": 1}, 2**70, -(2**70)]


class Gen:
    """Seeded generator of (fields, allowed error codes, id whose output stream gets the error | None)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0

    def next_id(self) -> str:
        self.n += 1
        return f"bad{self.n}"

    def item(self):
        kinds = [
            self.binary, self.broken_json, self.not_an_object, self.wrong_type, self.unknown_field,
            self.odd_id, self.missing_prompt, self.engine_refuses, self.no_job_field, self.duplicate_bad_id,
            self.dup_keys, self.limits, self.nested,
        ]  # fmt: skip
        return self.rng.choice(kinds)()

    def raw(self, obj) -> dict:
        return {JOB_FIELD: json.dumps(obj, ensure_ascii=self.rng.random() < 0.5).encode()}

    def binary(self):
        data = bytes(self.rng.randrange(256) for _ in range(self.rng.randrange(1, 64)))
        return {JOB_FIELD: b"\xff" + data}, {"invalid_json"}, None

    def broken_json(self):
        job_id = self.next_id()
        text = json.dumps({"id": job_id, "prompt": "hello", "max_tokens": 4})
        cut = self.rng.choice(
            [text[: self.rng.randrange(1, len(text) - 1)], text + "}", text.replace(":", "", 1)]
        )
        cut = cut if cut != text else text[:-1]
        return {JOB_FIELD: cut.encode()}, {"invalid_json"}, None

    def not_an_object(self):
        obj = self.rng.choice([[], [1, 2], "prompt", 42, None, True, 1e308, [{"id": "x"}]])
        return self.raw(obj), {"invalid_job"}, None

    def wrong_type(self):
        job_id = self.next_id()
        field = self.rng.choice(
            ["prompt", "max_tokens", "temperature", "n", "seed", "stop", "stop_token_ids", "ignore_eos",
             "priority", "deadline_ms", "messages", "prompt_token_ids", "v", "top_k", "logprobs"]
        )  # fmt: skip
        bad = {
            "prompt": [1, 2.5, ["x"], {"t": "x"}], "max_tokens": ["5", 1.5, [5], True],
            "temperature": ["hot", [0.1], True], "n": ["2", 1.5], "seed": ["x", 1.5, [1]],
            "stop": [5, [1, 2], {"a": "b"}], "stop_token_ids": ["a", [1.5], [-1], 7],
            "ignore_eos": ["yes", 1, None], "priority": [2**40, -(2**40), "high"], "deadline_ms": [-1, "soon"],
            "messages": ["hi", [{"role": 1, "content": "x"}], [{"content": "x"}], [{"role": "u", "content": "x", "x": 1}]],
            "prompt_token_ids": [[-1], [1.5], "1 2 3", [[1]]], "v": [2, "1", 0], "top_k": ["5", 0.5],
            "logprobs": ["3", 1.5],
        }[field]  # fmt: skip
        job = {"id": job_id, "max_tokens": 4}
        if field not in ("prompt", "messages", "prompt_token_ids"):
            job["prompt"] = "hello"
        if field == "ignore_eos" and self.rng.random() < 0.5:
            job[field] = None  # null is "not given": valid, so use a non-null wrong type instead
        job[field] = value = self.rng.choice([v for v in bad if v is not None])
        codes = {"invalid_job"}
        if field == "stop_token_ids" and value == [-1]:
            codes = {"invalid_params"}  # well-typed for the schema; the engine's range check refuses it
        elif field == "messages" and isinstance(value, list) and "x" in value[0]:
            codes = {"unknown_field"}
        return self.raw(job), codes, job_id

    def unknown_field(self):
        job_id = self.next_id()
        name = self.rng.choice(
            ["bogus", "__class__", "__proto__", "pickle", "eval", "Prompt", "ID", "\u00e9"]
        )
        job = {"id": job_id, "prompt": "hello", "max_tokens": 4, name: self.rng.choice(JSON_FIELD_JUNK)}
        return self.raw(job), {"unknown_field"}, job_id

    def odd_id(self):
        job_id = self.rng.choice(ODD_IDS + [v for v in JSON_FIELD_JUNK if not isinstance(v, str)])
        if isinstance(job_id, str) and job_id and self.rng.random() < 0.3:
            job_id = "ok" + job_id  # a valid prefix does not make it valid
        body = json.dumps({"id": job_id, "prompt": "hello", "max_tokens": 4}).encode()
        return {JOB_FIELD: body}, {"invalid_job"}, None

    def missing_prompt(self):
        job_id = self.next_id()
        job = {"id": job_id, "max_tokens": 4}
        if self.rng.random() < 0.5:
            job.update(prompt="a", messages=[{"role": "user", "content": "b"}])
        return self.raw(job), {"invalid_job"}, job_id

    def engine_refuses(self):
        job_id = self.next_id()
        field, value = self.rng.choice(
            [("temperature", -1.0), ("top_p", 0.0), ("top_k", -7), ("n", 0), ("seed", -1), ("logprobs", 10**9),
             ("min_p", 2.0), ("repetition_penalty", 0.0), ("stop", [""]), ("n", 10**6), ("seed", 2**200),
             ("min_tokens", -3)]
        )  # fmt: skip
        job = {"id": job_id, "prompt": "hello", "max_tokens": 4, field: value}
        if self.rng.random() < 0.2:
            body = (
                json.dumps({"id": job_id, "prompt": "x", "max_tokens": 4}).encode()[:-1]
                + b', "temperature": NaN}'
            )
            return {JOB_FIELD: body}, {"invalid_params", "invalid_job"}, job_id
        if self.rng.random() < 0.2:
            job = {"id": job_id, "prompt_token_ids": [1, 10**6], "max_tokens": 4}
            return self.raw(job), {"rejected"}, job_id
        return self.raw(job), {"invalid_params", "invalid_job"}, job_id

    def no_job_field(self):
        fields = self.rng.choice([{b"other": b"x"}, {b"JOB": b"{}"}, {b"job ": b"{}"}, {JOB_FIELD: b""}])
        return fields, {"invalid_json"}, None

    def duplicate_bad_id(self):
        job = {"id": "bad-repeated", "prompt": 123}  # the same bad id over and over: each one dead-lettered
        return self.raw(job), {"invalid_job"}, "bad-repeated"

    def dup_keys(self):
        job_id = self.next_id()
        body = f'{{"id": "{job_id}", "prompt": "x", "prompt": 7, "max_tokens": 4}}'.encode()
        return {JOB_FIELD: body}, {"invalid_job"}, job_id

    def nested(self):
        """Deep nesting, in the body or in a field; past MAX_JSON_DEPTH it is refused before parsing."""
        depth = self.rng.choice([50, 500, 2_000, 10_000])
        codes = {"invalid_job"} if depth <= MAX_JSON_DEPTH else {"invalid_json"}
        if self.rng.random() < 0.5:
            return {JOB_FIELD: b"[" * depth + b"]" * depth}, codes, None
        job_id = self.next_id()
        body = f'{{"id": "{job_id}", "prompt": "x", "stop": '.encode() + b"[" * depth + b"]" * depth + b"}"
        return {JOB_FIELD: body}, codes, job_id  # the id comes first: readable however deep the rest

    def limits(self):
        job_id = self.next_id()
        kind = self.rng.randrange(3)
        if kind == 0:  # a huge string: over the payload limit, refused before any parsing
            job = {"id": job_id, "prompt": "z" * self.rng.randrange(70_000, 200_000)}
            return self.raw(job), {"payload_too_large"}, None
        if kind == 1:
            job = {
                "id": job_id,
                "prompt": " ".join(["word"] * self.rng.randrange(200, 5000)),
                "max_tokens": 4,
            }
            return self.raw(job), {"prompt_too_long"}, job_id
        job = {"id": job_id, "prompt": "x", "max_tokens": self.rng.choice([33, 1000, 2**31, 2**70])}
        return self.raw(job), {"max_tokens_too_large"}, job_id


def _valid(k: int) -> dict:
    job = {"id": f"good{k}", "prompt": f"valid job {k} keeps flowing", "max_tokens": 6 + k % 10}
    job.update({"temperature": 0.0} if k % 2 == 0 else {"temperature": 0.7, "seed": k})
    return job


@pytest.mark.slow
@pytest.mark.timeout(200)
def test_fuzz_hostile_payloads_worker_stays_up(server, workers, model):
    r = server.client()
    w = workers.spawn(server.url, "fuzz", "--max-num-seqs", "16", *LIMITS)
    w.wait_started()
    gen = Gen(seed=5)
    bad: dict[bytes, tuple[set[str], str | None]] = {}
    good: list[dict] = []
    batch = 200
    for start in range(0, N_BAD, batch):
        items = [gen.item() for _ in range(batch)]
        pipe = r.pipeline(transaction=False)
        for fields, _, _ in items:
            pipe.xadd(K.requests, fields)
        for eid, (_, codes, out_id) in zip(pipe.execute(), items, strict=True):
            bad[eid] = (codes, out_id)
        # Valid jobs keep flowing between the batches, some enqueued twice (one generation each).
        jobs = [_valid(start // batch * 2), _valid(start // batch * 2 + 1)]
        enqueue_many(r, jobs + jobs[:1])
        good += jobs
    assert len(bad) == N_BAD

    def settled() -> bool:
        group = [g for g in r.xinfo_groups(K.requests) if g["name"] == GROUP.encode()][0]
        return (group["lag"] == 0 and group["pending"] == 0) or not w.alive()

    wait_until(settled, 150, "every entry read and acknowledged", 0.2)
    assert w.alive(), f"worker died: {w.log.read_text()[-2000:]}"
    results = wait_terminal(r, [j["id"] for j in good], 60)

    # The worker stayed up and every valid job is correct, exactly once.
    expected = expected_outputs(model, good)
    for job in good:
        chk = assert_exactly_once(job["id"], results[job["id"]])
        assert chk.end["type"] == "done", (job["id"], chk.end)
        assert chk.tokens == expected[job["id"]][0] and chk.end["text"] == expected[job["id"]][1], job["id"]

    # Every bad entry dead-lettered exactly once, with its code and a reason.
    dead = r.xrange(K.dead)
    assert len(dead) == N_BAD, "a valid job was dead-lettered, or a bad one twice"
    by_entry: dict[bytes, dict] = {}
    for _, fields in dead:
        assert fields[b"entry_id"] not in by_entry, "dead-lettered twice"
        by_entry[fields[b"entry_id"]] = fields
    assert set(by_entry) == set(bad)
    wrong = []
    for eid, (codes, _) in bad.items():
        fields = by_entry[eid]
        if fields[b"code"].decode() not in codes or not fields[b"reason"]:
            wrong.append(
                (eid, codes, fields[b"code"], fields[b"reason"][:100], fields.get(b"job", b"")[:120])
            )
    assert not wrong, f"{len(wrong)} wrong codes: {wrong[:10]}"

    # A payload that named a usable id gets its error event (the client is not left waiting).
    per_id: dict[str, list[set[str]]] = {}
    for codes, out_id in bad.values():
        if out_id is not None:
            per_id.setdefault(out_id, []).append(codes)
    for out_id, code_sets in per_id.items():
        events = read_events(r, out_id)
        assert len(events) == len(code_sets) and all(e["type"] == "error" for e in events), out_id
        assert all(e["message"] for e in events)
        assert {e["code"] for e in events} <= set().union(*code_sets), out_id
    assert r.xpending(K.requests, GROUP)["pending"] == 0
    assert r.hlen(K.attempts) == 0


@pytest.mark.timeout(90)
def test_deeply_nested_json_is_dead_lettered_and_does_not_kill_the_worker(server, workers, model):
    """json.loads raises RecursionError (not ValueError) on deep nesting: it must not escape intake."""
    r = server.client()
    w = workers.spawn(server.url, "nest", *LIMITS)
    w.wait_started()
    depth = 10_000  # far past the interpreter's recursion limit, under the 64 KiB payload limit
    payloads = [
        b"[" * depth + b"]" * depth,
        b'{"id": "nest1", "prompt": "x", "stop": ' + b"[" * depth + b"]" * depth + b"}",
        b'{"id": "nest2", "prompt": ' + b'{"a":' * depth + b"1" + b"}" * depth + b"}",
    ]
    entries = [r.xadd(K.requests, {JOB_FIELD: p}) for p in payloads]
    enqueue_many(r, [_valid(0)])
    deadline = time.monotonic() + 60
    while r.xlen(K.dead) < len(payloads) and w.alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert w.alive(), f"a deeply nested payload killed the worker: {w.log.read_text()[-1500:]}"
    dead = {f[b"entry_id"]: f for _, f in r.xrange(K.dead)}
    assert set(dead) == set(entries)
    assert {f[b"code"] for f in dead.values()} == {b"invalid_json"}
    assert wait_terminal(r, ["good0"], 30)["good0"][-1]["type"] == "done"
    assert r.xpending(K.requests, GROUP)["pending"] == 0
    assert "RecursionError" not in w.log.read_text()


@pytest.mark.timeout(90)
def test_an_unreadable_job_naming_a_usable_id_is_answered_once(server, workers, model):
    """threat-model.md: a payload that names a usable id gets an error event, however unreadable the rest."""
    r = server.client()
    w = workers.spawn(server.url, "unread", *LIMITS)
    w.wait_started()
    deep = 10_000
    payloads = {
        "latin1": b'{"id": "latin1", "prompt": "caf\xe9", "max_tokens": 4}',
        "surrogate": b'{"id": "surrogate", "prompt": "\xed\xa0\x80", "max_tokens": 4}',
        "after": b'{"prompt": "\xff\xfe", "id": "after", "max_tokens": 4}',
        "deep": b'{"id": "deep", "prompt": "x", "stop": ' + b"[" * deep + b"]" * deep + b"}",
        "cut": b'{"id": "cut", "prompt": "trunc',
    }
    for raw in payloads.values():
        r.xadd(K.requests, {JOB_FIELD: raw})
    enqueue_many(r, [_valid(0)])
    ends = wait_terminal(r, [*payloads, "good0"], 30)
    assert ends["good0"][-1]["type"] == "done"
    wait_until(lambda: r.xpending(K.requests, GROUP)["pending"] == 0, 10, "all entries acknowledged")
    for job_id in payloads:
        events = read_events(r, job_id)
        assert [(e["type"], e["code"]) for e in events] == [("error", "invalid_json")], job_id
    dead_ids = sorted(f[b"id"].decode() for _, f in r.xrange(K.dead))
    assert dead_ids == sorted(payloads)  # still dead-lettered, each once
    assert w.alive()
