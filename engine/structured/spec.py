"""What a request asks the output to look like: OpenAI's `response_format` and vLLM's `structured_outputs`,
validated, and reduced to one hashable `GrammarSpec` (the compile cache's key). No grammar engine here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

GrammarKind = Literal["json", "json_object", "regex", "grammar", "choice"]


@dataclass(frozen=True)
class GrammarSpec:
    """kind + spec text: a JSON schema (canonical JSON, sorted keys), a regex, an EBNF grammar, or for
    "choice" a JSON list of the allowed strings. "json_object" (any JSON object) has spec ""."""

    kind: GrammarKind
    spec: str


class JsonSchemaFormat(BaseModel):
    """OpenAI's `response_format.json_schema`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: str = Field(max_length=64)
    description: str | None = None
    # `schema` would shadow pydantic's BaseModel.schema; the wire name is still "schema".
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    """OpenAI's `response_format`: {"type": "text"} | {"type": "json_object"} |
    {"type": "json_schema", "json_schema": {"name", "schema", "strict"}}."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError(
                'response_format: "json_schema" is required with, and only with, type "json_schema"'
            )
        return self

    def grammar_spec(self) -> GrammarSpec | None:
        if self.type == "text":
            return None
        if self.type == "json_object" or self.json_schema is None or self.json_schema.schema_ is None:
            return GrammarSpec("json_object", "")
        return GrammarSpec("json", _canonical(self.json_schema.schema_))


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs`: exactly one of json (a schema, as an object or its JSON text), regex,
    choice, grammar (EBNF)."""

    model_config = ConfigDict(extra="forbid")

    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = Field(None, min_length=1)
    choice: list[str] | None = Field(None, min_length=1, max_length=1024)
    grammar: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _exactly_one(self) -> StructuredOutputs:
        given = [name for name in ("json_", "regex", "choice", "grammar") if getattr(self, name) is not None]
        if len(given) != 1:
            names = [g.rstrip("_") for g in given]
            raise ValueError(
                f"structured_outputs needs exactly one of json, regex, choice, grammar (got {names})"
            )
        if self.choice is not None and any(c == "" for c in self.choice):
            raise ValueError("structured_outputs.choice: choices must not be empty")
        if isinstance(self.json_, str):
            try:
                self.json_ = json.loads(self.json_)
            except ValueError as exc:
                raise ValueError(f"structured_outputs.json is not valid JSON: {exc}") from None
        return self

    def grammar_spec(self) -> GrammarSpec:
        if self.json_ is not None:
            return GrammarSpec("json", _canonical(self.json_))
        if self.regex is not None:
            return GrammarSpec("regex", self.regex)
        if self.choice is not None:
            return GrammarSpec("choice", json.dumps(self.choice))
        return GrammarSpec("grammar", self.grammar or "")


def _canonical(schema: object) -> str:
    return json.dumps(schema, sort_keys=True, separators=(",", ":"))
