"""A child process that compiles grammars, so that a compile running too long can be stopped.

xgrammar's compile is C++ that a Python thread cannot interrupt, and a pathological JSON schema (deeply nested
`oneOf`) can run for minutes. The compile therefore runs in a spawned child holding its own GrammarCompiler;
the caller waits on a pipe with a timeout, kills the child when it passes, and starts a fresh one for the
next compile. A compiled grammar comes back as xgrammar's JSON serialization (tens of ms for a 32000-token
vocabulary, see benchmarks/structured_outputs.py).

    parent (compile thread)          child (spawned)
      send (kind, spec)  ─────────▶  compile ─▶ serialize_json
      poll(timeout_s) ◀───────────── ("ok", json) | ("error", message)
      timeout: kill, raise GrammarError
"""

from __future__ import annotations

import os
import subprocess
import sys
from multiprocessing.connection import Connection
from pathlib import Path

from engine.errors import RejectReason, RequestRejected
from engine.structured.spec import GrammarSpec

# Importing xgrammar (and torch under it) in a fresh interpreter takes seconds on a busy machine.
_START_TIMEOUT_S = 300.0


class GrammarError(RequestRejected):
    """A grammar that cannot be compiled: invalid, unsupported, or too slow. The message is the user's."""

    def __init__(self, message: str) -> None:
        super().__init__(RejectReason.INVALID_CONSTRAINT, message)


class CompileProcess:
    def __init__(self, tokenizer_info_json: str, timeout_s: float) -> None:
        self.tokenizer_info_json = tokenizer_info_json
        self.timeout_s = timeout_s
        self._proc: subprocess.Popen | None = None
        self._send: Connection | None = None
        self._recv: Connection | None = None

    def compile(self, spec: GrammarSpec) -> str:
        """The compiled grammar's serialize_json(); raises GrammarError. Not thread-safe: one caller."""
        send, recv = self._ensure_started()
        send.send((spec.kind, spec.spec))
        if not recv.poll(self.timeout_s):
            self.close()
            raise GrammarError(
                f"compiling the {spec.kind} grammar took longer than {self.timeout_s:g} s and was stopped"
            )
        try:
            status, payload = recv.recv()
        except (EOFError, OSError):
            self.close()
            raise GrammarError("the grammar compile process died while compiling") from None
        if status != "ok":
            raise GrammarError(payload)
        return payload

    def close(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
        for conn in (self._send, self._recv):
            if conn is not None:
                conn.close()
        self._proc = self._send = self._recv = None

    def _ensure_started(self) -> tuple[Connection, Connection]:
        if self._proc is not None and self._proc.poll() is None and self._send and self._recv:
            return self._send, self._recv
        self.close()
        # A plain `python -m` child, not multiprocessing's spawn: spawn re-imports the caller's __main__,
        # which runs an unguarded user script a second time.
        to_child_r, to_child_w = os.pipe()
        to_parent_r, to_parent_w = os.pipe()
        root = str(Path(__file__).resolve().parents[2])  # the folder holding the `engine` package
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "engine.structured.compile_process", str(to_child_r), str(to_parent_w)],
            pass_fds=(to_child_r, to_parent_w),
            env=env,
            stdin=subprocess.DEVNULL,
        )
        os.close(to_child_r)
        os.close(to_parent_w)
        self._send = Connection(to_child_w, readable=False)
        self._recv = Connection(to_parent_r, writable=False)
        self._send.send(self.tokenizer_info_json)
        try:
            ready = self._recv.poll(_START_TIMEOUT_S) and self._recv.recv() == "ready"
        except (EOFError, OSError):
            ready = False
        if not ready:
            self.close()
            raise GrammarError("the grammar compile process did not start")
        return self._send, self._recv


def _serve(recv: Connection, send: Connection) -> None:
    import xgrammar as xgr

    from engine.structured.xgrammar_compile import compile_spec

    info = xgr.TokenizerInfo.deserialize_json(recv.recv())
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    send.send("ready")
    while True:
        try:
            kind, text = recv.recv()
        except (EOFError, OSError):
            return  # the parent closed the pipe or exited
        try:
            send.send(("ok", compile_spec(compiler, GrammarSpec(kind, text)).serialize_json()))
        except Exception as exc:  # the user's grammar is wrong: report, keep serving
            send.send(("error", clean_message(exc)))


def clean_message(exc: BaseException) -> str:
    """xgrammar's C++ errors start with "[hh:mm:ss] /project/cpp/file.cc:123: "; keep what follows."""
    import re

    text = str(exc).strip()
    return re.sub(r"^\[[\d:]+\] \S+:\d+: ", "", text) or type(exc).__name__


if __name__ == "__main__":
    _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False))
