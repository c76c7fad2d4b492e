"""Starting a throwaway redis-server on a free loopback port (for `conveyor demo` and the tests)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from dataclasses import dataclass

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class LocalRedis:
    process: subprocess.Popen
    port: int
    password: str | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        """By PID only: this process, nothing else."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def redis_server_path() -> str | None:
    return shutil.which("redis-server")


def start(
    port: int | None = None, extra_args: list[str] | None = None, password: str | None = None
) -> LocalRedis:
    binary = redis_server_path()
    if binary is None:
        raise RuntimeError("redis-server is not installed")
    port = port or free_port()
    args = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    if password:
        args += ["--requirepass", password]
    process = subprocess.Popen(
        args + (extra_args or []), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    server = LocalRedis(process, port, password)
    client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_connect_timeout=0.5)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            client.close()
            return server
        except redis.ConnectionError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"redis-server did not start on port {port}") from None
            time.sleep(0.01)


def answers(url: str) -> bool:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=0.5).ping()
        return True
    except (redis.ConnectionError, redis.TimeoutError, OSError, ValueError):
        return False
