"""`EngineClient` is the whole seam between worker and engine: LLMEngine and the worker tests' fake both
have every member it lists, with the same signature, and the worker calls nothing else on an engine."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from engine.client import EngineClient
from engine.llm_engine import LLMEngine
from tests.helpers.worker_fakes import FakeEngine

MEMBERS = [n for n, v in vars(EngineClient).items() if inspect.isfunction(v) and not n.startswith("_")]
WORKER = Path(__file__).resolve().parents[2] / "worker"


def _shape(fn) -> list[tuple[str, inspect._ParameterKind, object]]:
    """Names, kinds and defaults of the parameters: what a caller relies on (annotations may differ in
    spelling between a string and an evaluated type, so they are left to mypy)."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_protocol_lists_what_the_worker_uses():
    assert sorted(MEMBERS) == sorted(
        [
            "add_request",
            "step",
            "abort",
            "has_unfinished_requests",
            "stats",
            "step_tokens",
            "free_capacity",
            "kv_waste",
        ]
    )


@pytest.mark.parametrize("engine_class", [LLMEngine, FakeEngine])
@pytest.mark.parametrize("member", MEMBERS)
def test_engine_has_every_member_with_the_protocols_signature(engine_class, member):
    assert callable(getattr(engine_class, member, None)), f"{engine_class.__name__} lacks {member}"
    assert _shape(getattr(engine_class, member)) == _shape(getattr(EngineClient, member))


def test_a_fake_missing_a_member_is_caught():
    class Partial(FakeEngine):
        free_capacity = None  # type: ignore[assignment]

    assert not callable(getattr(Partial, "free_capacity", None))

    def add_request(self, request_id, prompt, params):  # no keyword-only arguments
        return 0

    assert _shape(add_request) != _shape(EngineClient.add_request)


def test_the_worker_calls_only_protocol_members_on_its_engine():
    called = set()
    for path in WORKER.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            # self.engine.<member>(...) or engine.<member>(...)
            if isinstance(node, ast.Attribute) and _is_engine(node.value):
                called.add(node.attr)
    assert called and called <= set(MEMBERS), called - set(MEMBERS)


def _is_engine(node: ast.expr) -> bool:
    if isinstance(node, ast.Name):
        return node.id == "engine"
    return isinstance(node, ast.Attribute) and node.attr == "engine" and isinstance(node.value, ast.Name)
