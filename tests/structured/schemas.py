"""Test schemas: what extraction and classification jobs ask for, bounded so a random tiny model ends them
within a few dozen tokens (a random model inside an unbounded string or number may never leave it)."""

from __future__ import annotations

NAME = {"type": "string", "maxLength": 6}
SMALL_INT = {"type": "integer", "minimum": 0, "maximum": 99}

SCHEMAS: dict[str, dict] = {
    "flat_object": {
        "type": "object",
        "properties": {"name": NAME, "age": SMALL_INT},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    "enum": {"type": "string", "enum": ["positive", "negative", "neutral"]},
    "integer_range": {"type": "integer", "minimum": -5, "maximum": 5},
    "number_range": {
        "type": "object",
        "properties": {"score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["score"],
        "additionalProperties": False,
    },
    "boolean": {"type": "boolean"},
    "array_bounds": {"type": "array", "items": SMALL_INT, "minItems": 2, "maxItems": 4},
    "array_of_enums": {
        "type": "array",
        "items": {"enum": ["red", "green", "blue"]},
        "minItems": 1,
        "maxItems": 3,
    },
    "nested_object": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {"id": SMALL_INT, "tag": NAME},
                "required": ["id", "tag"],
                "additionalProperties": False,
            },
            "active": {"type": "boolean"},
        },
        "required": ["user", "active"],
        "additionalProperties": False,
    },
    "optional_fields": {
        "type": "object",
        "properties": {"a": SMALL_INT, "b": NAME, "c": {"type": "boolean"}},
        "required": ["a"],
        "additionalProperties": False,
    },
    "defs_ref": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {"x": SMALL_INT, "y": SMALL_INT},
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"start": {"$ref": "#/$defs/point"}, "end": {"$ref": "#/$defs/point"}},
        "required": ["start", "end"],
        "additionalProperties": False,
    },
    "array_of_objects": {
        "type": "array",
        "items": {
            "type": "object",
            "properties": {"k": NAME, "v": SMALL_INT},
            "required": ["k", "v"],
            "additionalProperties": False,
        },
        "minItems": 1,
        "maxItems": 2,
    },
    "string_pattern": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
    "const_and_enum": {
        "type": "object",
        "properties": {"kind": {"const": "label"}, "label": {"enum": ["spam", "ham"]}},
        "required": ["kind", "label"],
        "additionalProperties": False,
    },
    "any_of": {"anyOf": [SMALL_INT, {"type": "string", "enum": ["none", "many"]}]},
    "nullable": {
        "type": "object",
        "properties": {"value": {"type": ["integer", "null"], "minimum": 0, "maximum": 9}},
        "required": ["value"],
        "additionalProperties": False,
    },
    "classification": {
        "type": "object",
        "properties": {
            "category": {"enum": ["billing", "technical", "other"]},
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "keywords": {"type": "array", "items": NAME, "maxItems": 2},
        },
        "required": ["category", "confidence", "keywords"],
        "additionalProperties": False,
    },
}
