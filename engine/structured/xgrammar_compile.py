"""GrammarSpec -> xgrammar: the one place that knows which xgrammar call compiles (or checks) each kind.

JSON is compiled without free whitespace (one space after ":" and ",", none elsewhere): a model then cannot
fill its budget with spaces between the tokens of a structure.
"""

from __future__ import annotations

import json
from typing import Any

from engine.structured.spec import GrammarSpec


def choice_ebnf(choices: list[str]) -> str:
    # JSON string literals are EBNF string literals (same escapes); non-ASCII stays as UTF-8.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def bounded_strings_as_patterns(node: Any) -> Any:
    """Rewrite `{"type": "string", "minLength": a, "maxLength": b}` (no pattern) as `"pattern": "^.{a,b}$"`.

    xgrammar 0.2 compiles length-bounded strings to a character class that admits raw control characters
    (invalid JSON: strict parsers reject it) and no escapes (xgrammar issue #800, fixes not merged); its
    pattern path is JSON-aware. `.` excludes newlines, which a bounded field rarely wants anyway.
    """
    if isinstance(node, list):
        return [bounded_strings_as_patterns(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = {k: bounded_strings_as_patterns(v) for k, v in node.items()}
    bounded = "minLength" in node or "maxLength" in node
    if node.get("type") == "string" and bounded and "pattern" not in node and "format" not in node:
        low, high = int(node.pop("minLength", 0)), node.pop("maxLength", None)
        node["pattern"] = f"^.{{{low},{'' if high is None else int(high)}}}$"
    return node


def _json_schema(spec: GrammarSpec) -> str:
    return json.dumps(bounded_strings_as_patterns(json.loads(spec.spec)))


def compile_spec(compiler: Any, spec: GrammarSpec) -> Any:
    """xgrammar.GrammarCompiler, GrammarSpec -> xgrammar.CompiledGrammar."""
    if spec.kind == "json":
        return compiler.compile_json_schema(_json_schema(spec), any_whitespace=False)
    if spec.kind == "json_object":
        # Not compile_builtin_json_grammar(): that accepts any JSON value (a top-level array too), while
        # OpenAI's json_object promises an object. Without free whitespace, as json_schema is written (a
        # random or small model otherwise fills an object with tabs and newlines: `{ \t\t}`).
        return compiler.compile_json_schema('{"type": "object"}', any_whitespace=False)
    if spec.kind == "regex":
        return compiler.compile_regex(spec.spec)
    if spec.kind == "choice":
        return compiler.compile_grammar(choice_ebnf(json.loads(spec.spec)))
    return compiler.compile_grammar(spec.spec)


def check_spec(spec: GrammarSpec) -> None:
    """Parse the spec into a grammar without compiling its token masks (fast, no tokenizer): raises the
    grammar engine's error for an invalid schema, regex or EBNF."""
    import xgrammar as xgr

    if spec.kind == "json":
        xgr.Grammar.from_json_schema(_json_schema(spec), any_whitespace=False)
    elif spec.kind == "regex":
        xgr.Grammar.from_regex(spec.spec)
    elif spec.kind == "choice":
        xgr.Grammar.from_ebnf(choice_ebnf(json.loads(spec.spec)))
    elif spec.kind == "grammar":
        xgr.Grammar.from_ebnf(spec.spec)
