"""The lean streaming client of benchmarks/http_e2e.py: `clients` keep-alive connections, each POSTing its
share of the requests in turn, every SSE event stamped with the time its bytes arrived.

The benchmark's first client (httpx, `--client httpx`) split lines and parsed every chunk's JSON in Python
as it came, in a process on the same two cores as the gateway and the engine, and stamped a chunk only
after that work: the client's CPU slowed the engine and its queue showed as the gateway's added latency.
Here the bytes are cut into events by httptools (C) as they arrive and stamped then; the events are parsed
as JSON, and so checked, only after the last request ends. Each event also carries the kernel's receive
time of its bytes (benchmarks/kernel_stamps.py), which this process's own queue does not delay.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time

import httptools

from benchmarks.kernel_stamps import receive, stamp_arrivals


class _Answer:
    """One connection, read with recvmsg on the loop's reader callback; `ask` sends a request and returns
    its SSE events as (arrival time, kernel receive time, bytes)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.done: asyncio.Future | None = None  # the answer being read: set when it ends
        self.now = self.kernel = 0.0
        asyncio.get_running_loop().add_reader(sock.fileno(), self._readable)

    @classmethod
    async def open(cls, host: str, port: int) -> _Answer:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        stamp_arrivals(sock)
        await asyncio.get_running_loop().sock_connect(sock, (host, port))
        return cls(sock)

    def close(self) -> None:
        asyncio.get_running_loop().remove_reader(self.sock.fileno())
        self.sock.close()

    async def ask(self, request: bytes) -> tuple[int, list[tuple[float, float, bytes]]]:
        self.parser = httptools.HttpResponseParser(self)
        self.done = asyncio.get_running_loop().create_future()
        self.events: list[tuple[float, float, bytes]] = []
        self.rest = b""
        await asyncio.get_running_loop().sock_sendall(self.sock, request)
        await self.done
        return self.parser.get_status_code(), self.events

    def _readable(self) -> None:
        try:
            data, kernel = receive(self.sock, 1 << 16)
        except (BlockingIOError, InterruptedError):
            return
        self.now = time.time()
        self.kernel = self.now if kernel is None else kernel
        if not data:
            # The gateway closed it (uvicorn ends a keep-alive connection idle for 5 s): a closed socket
            # stays readable, and the loop would call this again at every turn, for the rest of the run.
            asyncio.get_running_loop().remove_reader(self.sock.fileno())
            if self.done is not None and not self.done.done():
                self.done.set_exception(ConnectionError("the gateway closed the connection"))
            return
        self.parser.feed_data(data)

    # httptools callbacks
    def on_body(self, body: bytes) -> None:
        *complete, self.rest = (self.rest + body).split(b"\n\n")
        self.events.extend((self.now, self.kernel, event) for event in complete)

    def on_message_complete(self) -> None:
        if self.rest:
            self.events.append((self.now, self.kernel, self.rest))
        assert self.done is not None
        self.done.set_result(None)


def _request(host: str, job_id: str, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(payload)}\r\nx-request-id: {job_id}\r\n\r\n"
    )
    return head.encode() + payload


async def stream_all(
    host: str, ports: list[int], requests: list[tuple[str, dict]], clients: int, ready, go
) -> tuple[int, float, dict[str, list[float]], dict[str, list[float]], float]:
    """Run the requests, `clients` at a time: the connections open (on the ports in turn, one per gateway
    replica), `ready` is set, and the requests go
    once `go` is (both process Events). Returns the completion tokens (from the usage chunks), the end
    time (perf_counter), per job the arrival time of each token's chunk (a chunk with a choice and no
    finish reason, as the httpx client counted them) as this process read it and as the kernel received
    it (benchmarks/kernel_stamps.py), and the CPU seconds this process spent from go to end."""
    loop = asyncio.get_running_loop()
    answers = [await _Answer.open(host, ports[k % len(ports)]) for k in range(clients)]
    pending = iter(requests)
    raw: dict[str, list[tuple[float, float, bytes]]] = {}

    async def one_connection(answer: _Answer) -> None:
        for job_id, body in pending:  # a shared iterator: each connection takes the next request
            status, raw[job_id] = await answer.ask(_request(host, job_id, body))
            if status != 200:
                raise RuntimeError(f"{job_id}: HTTP {status}: {b''.join(e for _, _, e in raw[job_id])!r}")

    ready.set()
    await loop.run_in_executor(None, go.wait)
    cpu = time.process_time()
    await asyncio.gather(*(one_connection(a) for a in answers))
    end, cpu = time.perf_counter(), time.process_time() - cpu
    for answer in answers:
        answer.close()
    tokens, seen, seen_kernel = 0, dict[str, list[float]](), dict[str, list[float]]()
    for job_id, events in raw.items():
        times, kernel_times = seen[job_id], seen_kernel[job_id] = [], []
        for at, kernel_at, event in events:
            if not event.startswith(b"data: ") or event == b"data: [DONE]":
                continue
            chunk = json.loads(event[6:])
            if chunk.get("usage"):
                tokens += chunk["usage"]["completion_tokens"]
            if chunk["choices"] and chunk["choices"][0]["finish_reason"] is None:
                times.append(at)
                kernel_times.append(kernel_at)
    return tokens, end, seen, seen_kernel, cpu
