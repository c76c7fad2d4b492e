"""GrammarSpec -> xgrammar: the one place that knows which xgrammar call compiles (or checks) each kind.

JSON is compiled without free whitespace (compact output, as `json.dumps(separators=(",", ":"))` writes it):
a model then cannot fill its budget with spaces between tokens of a structure.
"""

from __future__ import annotations

import json
from typing import Any

from engine.structured.spec import GrammarSpec


def choice_ebnf(choices: list[str]) -> str:
    # JSON string literals are EBNF string literals (same escapes); non-ASCII stays as UTF-8.
    return "root ::= " + " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)


def compile_spec(compiler: Any, spec: GrammarSpec) -> Any:
    """xgrammar.GrammarCompiler, GrammarSpec -> xgrammar.CompiledGrammar."""
    if spec.kind == "json":
        return compiler.compile_json_schema(spec.spec, any_whitespace=False)
    if spec.kind == "json_object":
        return compiler.compile_builtin_json_grammar()
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
        xgr.Grammar.from_json_schema(spec.spec, any_whitespace=False)
    elif spec.kind == "regex":
        xgr.Grammar.from_regex(spec.spec)
    elif spec.kind == "choice":
        xgr.Grammar.from_ebnf(choice_ebnf(json.loads(spec.spec)))
    elif spec.kind == "grammar":
        xgr.Grammar.from_ebnf(spec.spec)
