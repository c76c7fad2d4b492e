"""`conveyor serve` processes for the gateway tests, and the engine's own greedy answer to compare with."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import httpx

from tests.helpers.waiting import wait_until
from worker.local_redis import free_port

if TYPE_CHECKING:
    from engine import LLMEngine

ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class GatewayProc:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def stop(self) -> None:
        """By PID only."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def spawn_gateway(url: str, log_dir: Path, *extra: str) -> GatewayProc:
    """`conveyor serve` on a free loopback port, started once /health answers 200."""
    port = free_port()
    args = [sys.executable, "-m", "worker.cli", "serve", "--redis-url", url, "--port", str(port), *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    log = log_dir / f"gateway-{port}.log"
    proc = subprocess.Popen(
        args, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(log, "wb"), stdin=subprocess.DEVNULL
    )
    gateway = GatewayProc(proc, port, log)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited: {log.read_text()[-2000:]}")
        try:
            return httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    wait_until(up, 60, "the gateway to answer /health", 0.1)
    return gateway


_ENGINES: dict[str, LLMEngine] = {}


def local_engine(model: str) -> LLMEngine:
    """An engine on `model` in this process, made once per model (the reference the served answers match)."""
    import torch

    from engine import LLMEngine

    torch.set_num_threads(1)
    engine = _ENGINES.get(model)
    if engine is None:
        engine = _ENGINES[model] = LLMEngine(model, num_kv_blocks=256, max_num_seqs=4)
    return engine


def greedy(model: str, prompt, max_tokens: int, ignore_eos: bool = False) -> str:
    """The engine's own greedy text for a prompt (a str, or a list of chat messages) in this process."""
    from engine import SamplingParams
    from engine.prompt import Chat

    engine = local_engine(model)
    given = Chat(prompt) if isinstance(prompt, list) else prompt
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=ignore_eos)
    return engine.generate([given], params)[0].text
