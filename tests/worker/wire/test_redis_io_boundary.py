"""Only worker/wire/ reaches below redis-py's public API (issue 24): no other worker module calls or
overrides a connection's or a pool's internals, or subclasses redis-py's pools and connections."""

from __future__ import annotations

import ast
from pathlib import Path

WORKER = Path(__file__).resolve().parents[3] / "worker"
# The wire modules that talk to Redis below its public API; the rest of worker/wire/ does not.
ALLOWED = {WORKER / "wire" / name for name in ("exchange.py", "slot_following.py", "async_packing.py")}

# What a round's wire and a slot-following pool need, and nothing else of the worker does.
INTERNALS = {
    "get_connection",
    "read_response",
    "send_packed_command",
    "send_command",
    "pack_command",
    "pack_commands",
    "_sock",
    "_parser",
    "_get_free_connections",
    "_get_in_use_connections",
    "_available_connections",
    "_in_use_connections",
}
BASES = {
    "ConnectionPool",
    "BlockingConnectionPool",
    "Connection",
    "SSLConnection",
    "UnixDomainSocketConnection",
}


def reaches_below(tree: ast.AST) -> list[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in INTERNALS:
            found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in INTERNALS:
            found.append(f"line {node.lineno}: def {node.name}")
        elif isinstance(node, ast.ClassDef):
            for base in node.bases:
                name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
                if name in BASES:
                    found.append(f"line {node.lineno}: class {node.name}({name})")
    return found


def test_no_worker_module_but_the_wire_io_touches_connection_internals():
    outside = {}
    for path in sorted(WORKER.rglob("*.py")):
        if path in ALLOWED:
            continue
        found = reaches_below(ast.parse(path.read_text(), str(path)))
        if found:
            outside[str(path.relative_to(WORKER))] = found
    assert outside == {}


def test_the_check_sees_each_kind_of_reach():
    source = """
import redis
class Pool(redis.ConnectionPool):
    def get_connection(self): ...
def f(client):
    client.connection_pool.get_connection().send_packed_command(b"")
"""
    assert reaches_below(ast.parse(source)) == [
        "line 3: class Pool(ConnectionPool)",
        "line 4: def get_connection",
        "line 6: .send_packed_command",
        "line 6: .get_connection",
    ]
    # ... and those modules do reach below (so the first test is not vacuous).
    assert any(reaches_below(ast.parse(p.read_text())) for p in ALLOWED)
