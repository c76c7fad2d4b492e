"""Constrained decoding through the engine API on a tiny random model, which never writes JSON by itself."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import RequestRejected, SamplingParams
from tests.structured.schemas import SCHEMAS

PROMPTS = ["The quick brown fox", "Hello there, how are you today?", "Numbers like 1, 2, 3"]


def _json(schema: dict, **kw) -> SamplingParams:
    kw.setdefault("temperature", 0)
    return SamplingParams(max_tokens=kw.pop("max_tokens", 96), structured_outputs={"json": schema}, **kw)


def _valid(text: str, schema: dict) -> None:
    jsonschema.validate(json.loads(text), schema)


def test_every_schema_validates_greedy_and_sampled(llm):
    names = sorted(SCHEMAS)
    params = [_json(SCHEMAS[n]) for n in names] + [_json(SCHEMAS[n], temperature=1.0, seed=7) for n in names]
    outs = llm.generate([PROMPTS[i % 3] for i in range(len(params))], params)
    for i, out in enumerate(outs):
        name = names[i % len(names)]
        assert out.finish_reason == "stop", (name, out.text)
        _valid(out.text, SCHEMAS[name])


def test_openai_response_format_json_schema_and_json_object(llm):
    schema = SCHEMAS["nested_object"]
    fmt = {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}
    a, b = llm.generate(
        PROMPTS[:2],
        [
            SamplingParams(max_tokens=96, temperature=0, response_format=fmt),
            SamplingParams(max_tokens=96, temperature=0.7, seed=3, response_format={"type": "json_object"}),
        ],
    )
    _valid(a.text, schema)
    if b.finish_reason == "stop":  # a free-form object may run long: only a finished one must parse
        assert isinstance(json.loads(b.text), dict)
    else:
        assert b.finish_reason == "length" and b.text.startswith("{")


def test_regex_matches_in_full_and_choice_is_one_of_the_choices(llm):
    pattern = r"[a-z]{2,5}-[0-9]{2}(\.[0-9])?"
    choices = ["yes", "no", "not sure", "ça dépend"]
    params = [
        SamplingParams(max_tokens=32, temperature=t, seed=1, structured_outputs={"regex": pattern})
        for t in (0, 1)
    ]
    params += [
        SamplingParams(max_tokens=32, temperature=t, seed=2, structured_outputs={"choice": choices})
        for t in (0, 1)
    ]
    outs = llm.generate([PROMPTS[0], PROMPTS[1], PROMPTS[2], PROMPTS[0]], params)
    for out in outs[:2]:
        assert out.finish_reason == "stop" and re.fullmatch(pattern, out.text), out.text
    for out in outs[2:]:
        assert out.finish_reason == "stop" and out.text in choices, out.text


def test_ebnf_grammar(llm):
    grammar = 'root ::= "(" expr ")"\nexpr ::= [0-9] | [0-9] "+" expr'
    out = llm.generate(
        PROMPTS[:1], SamplingParams(max_tokens=40, temperature=0, structured_outputs={"grammar": grammar})
    )[0]
    assert out.finish_reason == "stop" and re.fullmatch(r"\([0-9](\+[0-9])*\)", out.text), out.text


def test_unconstrained_requests_get_exactly_their_tokens_alone(llm):
    free = SamplingParams(max_tokens=24, temperature=0, ignore_eos=True)
    alone = llm.generate(PROMPTS, free)
    mixed = llm.generate(
        [PROMPTS[0], "x", PROMPTS[1], "y", PROMPTS[2]],
        [free, _json(SCHEMAS["flat_object"]), free, _json(SCHEMAS["array_of_objects"]), free],
    )
    assert [o.token_ids for o in (mixed[0], mixed[2], mixed[4])] == [o.token_ids for o in alone]
    _valid(mixed[1].text, SCHEMAS["flat_object"])


def test_max_tokens_mid_structure_ends_with_length(llm):
    out = llm.generate(PROMPTS[:1], _json(SCHEMAS["defs_ref"], max_tokens=4))[0]
    assert out.finish_reason == "length" and len(out.token_ids) == 4
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_stop_string_ends_a_constrained_request(llm):
    full = llm.generate(PROMPTS[:1], _json(SCHEMAS["flat_object"]))[0].text
    cut = full.index(",")
    out = llm.generate(PROMPTS[:1], _json(SCHEMAS["flat_object"], stop=[","]))[0]
    assert out.finish_reason == "stop" and out.text == full[:cut]


def test_n_samples_each_follow_the_grammar(llm):
    schema = SCHEMAS["array_of_enums"]
    out = llm.generate(PROMPTS[1:2], _json(schema, n=4, temperature=1.0, seed=11))[0]
    texts = [o.text for o in out.outputs]
    for o in out.outputs:
        assert o.finish_reason == "stop"
        _valid(o.text, schema)
    assert len(set(texts)) > 1, texts  # really sampled, not one fork copied


def test_resumed_request_replays_its_prior_tokens_through_the_grammar(llm):
    """A takeover: the new worker's engine gets the published tokens and continues the structure."""
    schema = SCHEMAS["classification"]
    full = llm.generate(PROMPTS[:1], _json(schema))[0]
    assert len(full.token_ids) > 6
    prior = full.token_ids[:5]
    llm.add_request("resumed", PROMPTS[0], _json(schema), prior_output_token_ids=[prior])
    tokens = []
    while llm.has_unfinished_requests():
        for d in llm.step():
            tokens += d.new_token_ids
            reason, text = d.finish_reason, d.text
    assert reason == "stop" and prior + tokens == full.token_ids
    _valid(text, schema)


def test_prior_tokens_that_break_the_grammar_fail_the_request(llm):
    bad = llm.tokenizer.encode("hello", add_special_tokens=False)
    llm.add_request("bad-prior", PROMPTS[0], _json(SCHEMAS["enum"]), prior_output_token_ids=[bad])
    finals = [d for _ in range(200) if llm.has_unfinished_requests() for d in llm.step() if d.finished]
    assert [(d.finish_reason, "does not fit the grammar" in (d.error or "")) for d in finals] == [
        ("abort", True)
    ]


@pytest.mark.parametrize(
    ("constraint", "message"),
    [
        ({"json": {"type": "nope"}}, "nope"),
        ({"json": {"$ref": "#/$defs/missing"}}, "missing"),
        ({"regex": "(ab"}, "parenthesis"),
        ({"grammar": "root ::= "}, "EBNF"),
    ],
)
def test_invalid_constraints_are_rejected_with_the_grammar_engine_message(llm, constraint, message):
    params = SamplingParams(structured_outputs=constraint)
    with pytest.raises(RequestRejected, match=message):
        llm.add_request("invalid", "x", params)
    assert not llm.has_unfinished_requests()


_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def _free_whitespace(text: str) -> list[str]:
    """Whitespace outside strings beyond the one space after `,` and `:` (an unfinished last string is
    cut off first)."""
    if len(re.findall(r'(?<!\\)"', _STRING.sub("", text))) % 2:
        text = text[: text.rindex('"')]
    bare = _STRING.sub('""', text).replace(", ", ",").replace(": ", ":")
    return re.findall(r"\s+", bare)


def test_json_object_is_written_without_free_whitespace_as_json_schema_is(llm):
    """docs/protocol.md: JSON is written without free whitespace. json_object gave `{ \\t\\t}`."""
    params = [
        SamplingParams(max_tokens=40, temperature=1.0, seed=seed, response_format={"type": "json_object"})
        for seed in range(8)
    ]
    outs = llm.generate([PROMPTS[i % 3] for i in range(len(params))], params)
    for out in outs:
        assert out.text.startswith("{"), out.text
        assert _free_whitespace(out.text) == [], repr(out.text)
        if out.finish_reason == "stop":
            assert isinstance(json.loads(out.text), dict)
