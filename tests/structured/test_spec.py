"""response_format / structured_outputs on SamplingParams: accepted shapes, refused combinations, cache keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from engine.sampling_params import SamplingParams
from engine.structured.spec import GrammarSpec
from engine.structured.xgrammar_compile import bounded_strings_as_patterns, choice_ebnf


def test_openai_response_formats():
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}}}
    fmt = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
    assert SamplingParams(response_format=fmt).grammar_spec == GrammarSpec(
        "json", '{"properties":{"a":{"type":"string"},"b":{"type":"integer"}},"type":"object"}'
    )
    assert SamplingParams(response_format={"type": "json_object"}).grammar_spec == GrammarSpec(
        "json_object", ""
    )
    assert SamplingParams(response_format={"type": "text"}).grammar_spec is None
    assert SamplingParams().grammar_spec is None


def test_vllm_structured_outputs_kinds():
    assert SamplingParams(structured_outputs={"regex": "a+"}).grammar_spec == GrammarSpec("regex", "a+")
    assert SamplingParams(structured_outputs={"choice": ["a", "b"]}).grammar_spec == GrammarSpec(
        "choice", '["a", "b"]'
    )
    assert SamplingParams(structured_outputs={"grammar": 'root ::= "a"'}).grammar_spec.kind == "grammar"
    # A schema given as JSON text and as an object is one cache entry.
    as_text = SamplingParams(structured_outputs={"json": '{"type": "integer"}'}).grammar_spec
    assert as_text == SamplingParams(structured_outputs={"json": {"type": "integer"}}).grammar_spec


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"structured_outputs": {"regex": "a", "choice": ["b"]}}, "exactly one"),
        ({"structured_outputs": {}}, "exactly one"),
        ({"structured_outputs": {"json": "{not json"}}, "not valid JSON"),
        ({"structured_outputs": {"choice": ["a", ""]}}, "must not be empty"),
        ({"structured_outputs": {"regex": "a"}, "response_format": {"type": "json_object"}}, "not both"),
        ({"structured_outputs": {"regex": "a"}, "min_tokens": 2}, "min_tokens"),
        ({"response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
        ({"response_format": {"type": "json_schema"}}, "json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format"),
        ({"structured_outputs": {"yaml": "a"}}, "yaml"),
    ],
)
def test_refused(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        SamplingParams(**kwargs)


def test_text_format_keeps_every_option():
    """{"type": "text"} constrains nothing, so the options refused with a grammar stay allowed and kept."""
    params = SamplingParams(response_format={"type": "text"}, min_tokens=2, ignore_eos=True)
    assert params.grammar_spec is None
    assert (params.min_tokens, params.ignore_eos) == (2, True)


def test_bounded_strings_become_patterns_recursively():
    schema = {
        "type": "array",
        "items": {"type": "string", "maxLength": 4},
        "$defs": {"a": {"type": "string", "minLength": 2}},
    }
    assert bounded_strings_as_patterns(schema) == {
        "type": "array",
        "items": {"type": "string", "pattern": "^.{0,4}$"},
        "$defs": {"a": {"type": "string", "pattern": "^.{2,}$"}},
    }
    kept = {"type": "string", "maxLength": 4, "pattern": "^[a-z]+$"}
    assert bounded_strings_as_patterns(kept) == kept


def test_choice_literals_are_escaped():
    assert choice_ebnf(['say "hi"', "a\\b", "ça"]) == 'root ::= "say \\"hi\\"" | "a\\\\b" | "ça"'
