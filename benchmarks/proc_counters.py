"""What Linux's /proc counts for a process so far: CPU time and write system calls (None where /proc
cannot tell), and the CPU's name for a benchmark's JSON. Shared by the benchmarks."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_seconds(pid: int) -> float | None:
    """The CPU time (user + system) a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def write_calls(pid: int) -> float | None:
    """The write system calls (write, send, sendmsg, ...) a process has made so far: /proc's `syscw`."""
    try:
        io = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return None
    counts = dict(line.split(": ") for line in io.splitlines())
    return int(counts["syscw"])


def cpu_name() -> str:
    """The CPU's model name as /proc/cpuinfo gives it (platform's guess elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()
