"""The default affinity key (worker/affinity_key.py): the examples table other-language clients test
against (docs/affinity-keys.json), the rule computed by hand and by a second language, and multi-turn."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from worker.affinity_key import PREFIX_CHARS, default_affinity, with_affinity

TABLE = Path(__file__).resolve().parents[3] / "docs" / "affinity-keys.json"
EXAMPLES = json.loads(TABLE.read_text(encoding="utf-8"))["examples"]


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["name"] for e in EXAMPLES])
def test_the_examples_table(example):
    assert with_affinity(example["job"]).get("affinity") == example["key"]  # the key the clients send


@pytest.mark.parametrize("example", EXAMPLES, ids=[e["name"] for e in EXAMPLES])
def test_the_examples_shard_of_eight(example):
    from worker.shard_choice import choose_shard

    assert choose_shard(with_affinity(example["job"]), 8) == example["shard"]


def test_the_table_says_the_documented_prefix_length():
    assert json.loads(TABLE.read_text(encoding="utf-8"))["prefix_chars"] == PREFIX_CHARS == 256


def test_the_rule_written_out_by_hand():
    system = {"role": "system", "content": "You are terse."}
    user = {"role": "user", "content": "Hi"}
    assert default_affinity({"prompt": "Once upon a time"}) == sha("Once upon a time")
    assert default_affinity({"messages": [system, user]}) == sha("system\nYou are terse.\n")
    long = "x" * 300
    assert default_affinity({"prompt": long}) == sha("x" * 256)
    assert default_affinity({"prompt": "é" * 300}) == sha("é" * 256)  # code points, not bytes


def test_no_key_for_what_the_rule_cannot_see_or_malformed_jobs():
    for job in (
        {"prompt": ""},
        {"prompt_token_ids": [1, 2]},
        {"messages": [{"role": "user", "content": "Hi"}]},
        {"messages": "not a list"},
        {"messages": [{"role": "system", "content": 7}, {"role": "user", "content": "Hi"}]},
        {"messages": [None, {"role": "user", "content": "Hi"}]},
        {"prompt": 5},
        {},
    ):
        assert default_affinity(job) is None, job
        assert with_affinity(job) is job


def test_with_affinity_adds_the_key_to_a_copy_and_keeps_an_explicit_one():
    job = {"id": "a", "prompt": "Once upon a time"}
    keyed = with_affinity(job)
    assert keyed == {**job, "affinity": sha("Once upon a time")} and "affinity" not in job
    own = {"id": "b", "prompt": "Once upon a time", "affinity": "doc-7"}
    assert with_affinity(own) is own


def test_turn_k_plus_1_gets_the_key_of_the_conversation_so_far():
    document = "Chapter 1. " + "The lighthouse keeper counts the ships at dusk. " * 8
    conversation = [{"role": "system", "content": document}]
    keys = []
    for turn in range(4):
        conversation.append({"role": "user", "content": f"Question {turn}?"})
        keys.append(default_affinity({"messages": conversation}))
        # the conversation so far, as a prompt of its own (everything before the new user message)
        so_far = "".join(f"{m['role']}\n{m['content']}\n" for m in conversation[:-1])
        assert keys[-1] == sha(so_far[:PREFIX_CHARS])
        conversation.append({"role": "assistant", "content": f"Answer {turn}."})
    assert len(set(keys)) == 1  # the opening is over 256 characters: one key for the whole conversation


def test_a_short_conversation_changes_key_until_its_text_is_256_characters():
    conversation = [{"role": "user", "content": "Hi"}]
    keys = [default_affinity({"messages": conversation})]
    for turn in range(6):
        conversation += [{"role": "assistant", "content": "y" * 60}, {"role": "user", "content": f"q{turn}"}]
        keys.append(default_affinity({"messages": conversation}))
    assert keys[0] is None and keys[1] != keys[2]
    assert keys[-1] == keys[-2]  # past 256 characters the key no longer changes


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_another_language_computes_the_same_keys_from_the_table():
    """The rule as a JavaScript client writes it (code points via Array.from, not UTF-16 units)."""
    script = r"""
const crypto = require("crypto");
const table = JSON.parse(require("fs").readFileSync(process.argv[1], "utf8"));
function text(job) {
  if (typeof job.prompt === "string") return job.prompt;
  if (!Array.isArray(job.messages)) return null;
  let last = -1;
  job.messages.forEach((m, i) => { if (m.role === "user") last = i; });
  const before = last < 0 ? job.messages : job.messages.slice(0, last);
  return before.map((m) => m.role + "\n" + m.content + "\n").join("");
}
function key(job) {
  if (job.affinity) return job.affinity;
  const t = text(job);
  if (!t) return null;
  const head = Array.from(t).slice(0, table.prefix_chars).join("");
  return crypto.createHash("sha256").update(head, "utf8").digest("hex");
}
console.log(JSON.stringify(table.examples.map((e) => key(e.job))));
"""
    out = subprocess.run(["node", "-e", script, str(TABLE)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == [e["key"] for e in EXAMPLES]


def test_the_protocol_page_states_the_prefix_length():
    text = " ".join((TABLE.parent / "protocol.md").read_text().split())
    assert f"Its first **{PREFIX_CHARS} characters**" in text


@pytest.mark.redis
def test_the_python_client_sends_the_default_key_unless_told_not_to(r):
    from worker.client import enqueue
    from worker.keys import JOB_FIELD, Keys

    enqueue(r, {"id": "a", "prompt": "Once upon a time"})
    enqueue(r, {"id": "b", "prompt": "Once upon a time"}, affinity=False)
    enqueue(r, {"id": "c", "prompt": "Once upon a time", "affinity": "mine"})
    sent = [json.loads(fields[JOB_FIELD]) for _, fields in r.xrange(Keys().requests)]
    assert [job.get("affinity") for job in sent] == [sha("Once upon a time"), None, "mine"]
