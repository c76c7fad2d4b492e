"""uvicorn's HTTP protocol with and without worker/gateway/held_headers.py, side by side in one run: the
server's CPU per short streamed answer (status and headers, one chunk, the end: a 2-token stream) over
real loopback sockets, and its write system calls per answer.

    python benchmarks/held_headers.py [--connections 32] [--answers 300] [--rounds 7]

One process serves (uvloop, the protocol under test, a bare ASGI app sending the three messages); a
client process keeps `--connections` keep-alive connections, each asking again as soon as its answer has
ended. The server's CPU (process_time) from the first request to the last answer, per answer. Each round
runs both protocols, in turns; printed per round and as the ratio held / plain.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import selectors
import socket
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import uvicorn  # noqa: E402
from uvicorn.protocols.http.auto import AutoHTTPProtocol  # noqa: E402
from uvicorn.server import ServerState  # noqa: E402

from benchmarks.proc_counters import write_calls  # noqa: E402
from worker.gateway.held_headers import HeldHeadersProtocol  # noqa: E402

REQUEST = b"GET / HTTP/1.1\r\nhost: bench\r\n\r\n"
END = b"0\r\n\r\n"  # the chunked encoding's end


async def app(scope, receive, send) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    )
    await send({"type": "http.response.body", "body": b'data: {"text": "token"}\n\n', "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


def client(port: int, connections: int, answers: int, done) -> None:
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(connections)]
    selector = selectors.DefaultSelector()
    left, pending = {}, {}
    for sock in socks:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        selector.register(sock, selectors.EVENT_READ)
        left[sock], pending[sock] = answers, b""
        sock.sendall(REQUEST)
    while left:
        for key, _ in selector.select():
            sock = key.fileobj
            pending[sock] += sock.recv(1 << 16)
            if END not in pending[sock]:
                continue
            pending[sock] = pending[sock].partition(END)[2]
            left[sock] -= 1
            if left[sock]:
                sock.sendall(REQUEST)
            else:
                selector.unregister(sock)
                del left[sock]
    done.set()


async def one_run(protocol: type, connections: int, answers: int) -> tuple[float, float]:
    """(server CPU µs per answer, socket writes per answer)."""
    config = uvicorn.Config(app, access_log=False, log_level="warning", http=protocol)
    config.load()
    state = ServerState()

    def made() -> asyncio.Protocol:
        return config.http_protocol_class(config=config, server_state=state, app_state={})

    server = await asyncio.get_running_loop().create_server(made, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    spawn = mp.get_context("spawn")  # a fresh interpreter, not a copy of this one's loop
    done = spawn.Event()
    process = spawn.Process(target=client, args=(port, connections, answers, done))
    process.start()
    while not state.connections:  # the client is connecting
        await asyncio.sleep(0.001)
    started, writes = time.process_time(), write_calls(os.getpid())
    while not done.is_set():
        if not process.is_alive():  # the client failed: its traceback is above
            raise SystemExit(f"the client process ended with {process.exitcode}")
        await asyncio.sleep(0.002)
    cpu, writes = time.process_time() - started, write_calls(os.getpid()) - writes
    process.join()
    server.close()
    total = connections * answers
    return cpu / total * 1e6, writes / total


async def main(args) -> None:
    ratios = []
    for round_ in range(args.rounds):
        results = {}
        order = (
            (AutoHTTPProtocol, HeldHeadersProtocol)
            if round_ % 2 == 0
            else (HeldHeadersProtocol, AutoHTTPProtocol)
        )
        for protocol in order:
            results[protocol] = await one_run(protocol, args.connections, args.answers)
        (plain_cpu, plain_writes), (held_cpu, held_writes) = (
            results[AutoHTTPProtocol],
            results[HeldHeadersProtocol],
        )
        ratios.append(held_cpu / plain_cpu)
        print(
            f"round {round_ + 1}: plain {plain_cpu:.1f} µs/answer, {plain_writes:.2f} writes; "
            f"held {held_cpu:.1f} µs/answer, {held_writes:.2f} writes; CPU ratio {ratios[-1]:.3f}"
        )
    print(
        f"CPU per answer, held / plain: median {sorted(ratios)[len(ratios) // 2]:.3f} over {args.rounds} rounds"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=32)
    parser.add_argument("--answers", type=int, default=300, help="answers per connection")
    parser.add_argument("--rounds", type=int, default=7)
    import uvloop

    uvloop.run(main(parser.parse_args()))
