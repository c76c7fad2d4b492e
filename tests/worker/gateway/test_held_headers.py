"""HeldHeaders: a response's header block goes out in one write with its first body, bytes and order kept;
driven through uvicorn's own HTTP protocol as `conveyor serve` runs it."""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.server import ServerState

from worker.gateway.held_headers import HeldHeaders, HeldHeadersProtocol

HEAD = b"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\n\r\n"


class Recording(asyncio.Transport):
    """A transport that keeps each write apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.closed = self.aborted = False

    def write(self, data) -> None:
        self.writes.append(bytes(data))

    def writelines(self, lines) -> None:
        self.writes.extend(bytes(line) for line in lines)

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name, default=None):
        return {"peername": ("127.0.0.1", 40000), "sockname": ("127.0.0.1", 8000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_protocol(self, protocol) -> None:
        pass


async def _turn() -> None:
    await asyncio.sleep(0)
    await asyncio.sleep(0)


def test_the_header_block_goes_out_with_the_next_write():
    async def main():
        inner = Recording()
        held = HeldHeaders(inner)
        held.write(HEAD)
        assert inner.writes == []
        held.write(b"5\r\nhello\r\n")
        assert inner.writes == [HEAD + b"5\r\nhello\r\n"]
        held.write(b"0\r\n\r\n")  # later writes are not held
        assert inner.writes[1:] == [b"0\r\n\r\n"]
        await _turn()
        assert len(inner.writes) == 2

    asyncio.run(main())


def test_a_header_block_alone_goes_out_at_the_next_turn():
    async def main():
        inner = Recording()
        held = HeldHeaders(inner)
        held.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        assert inner.writes == []
        assert held.get_write_buffer_size() == len(b"HTTP/1.1 100 Continue\r\n\r\n")
        await _turn()
        assert inner.writes == [b"HTTP/1.1 100 Continue\r\n\r\n"]
        held.write(memoryview(HEAD))  # a buffer other than bytes
        held.write(memoryview(b"body"))
        assert inner.writes[1:] == [HEAD + b"body"]

    asyncio.run(main())


def test_closing_sends_what_is_held_first_and_aborting_drops_it():
    async def main():
        inner = Recording()
        held = HeldHeaders(inner)
        held.write(HEAD)
        held.close()
        assert inner.writes == [HEAD] and inner.closed
        other = Recording()
        held = HeldHeaders(other)
        held.write(HEAD)
        held.abort()
        await _turn()
        assert other.writes == [] and other.aborted
        assert held.get_extra_info("peername") == ("127.0.0.1", 40000)  # the rest is the transport's

    asyncio.run(main())


def _serve(app, request: bytes) -> Recording:
    """uvicorn's protocol, as `conveyor serve` runs it, given one request to `app`; its transport records
    the writes."""
    config = uvicorn.Config(app, access_log=False, log_level="warning", http=HeldHeadersProtocol)
    config.load()
    protocol = config.http_protocol_class(config=config, server_state=ServerState(), app_state={})
    transport = Recording()
    protocol.connection_made(transport)
    protocol.data_received(request)
    return transport


async def _answer(app, request: bytes) -> list[bytes]:
    transport = _serve(app, request)
    for _ in range(20):
        await asyncio.sleep(0.005)
    return transport.writes


GET = b"GET / HTTP/1.1\r\nhost: x\r\n\r\n"


def test_a_whole_answer_is_one_write_through_uvicorn():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"ok"})

    (write,) = asyncio.run(_answer(app, GET))
    assert write.startswith(b"HTTP/1.1 200 OK\r\n") and write.endswith(b"\r\n\r\nok")


def test_a_stream_s_first_chunk_rides_with_its_headers_and_the_rest_follow_apart():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"first", "more_body": True})
        await asyncio.sleep(0.01)  # the next chunk comes at a later turn
        await send({"type": "http.response.body", "body": b"last", "more_body": False})

    writes = asyncio.run(_answer(app, GET))
    assert len(writes) == 2
    assert writes[0].startswith(b"HTTP/1.1 200 OK\r\n") and writes[0].endswith(b"\r\n\r\n5\r\nfirst\r\n")
    assert writes[1] == b"4\r\nlast\r\n0\r\n\r\n"


def test_headers_sent_before_a_slow_body_go_out_without_it():
    gate = asyncio.Event()

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await gate.wait()
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def main():
        transport = _serve(app, GET)
        for _ in range(5):
            await asyncio.sleep(0.005)
        (head,) = transport.writes  # out while the body is not ready
        assert head.startswith(b"HTTP/1.1 200 OK\r\n") and head.endswith(b"\r\n\r\n")
        gate.set()
        for _ in range(5):
            await asyncio.sleep(0.005)
        assert transport.writes[1:] == [b"0\r\n\r\n"]

    asyncio.run(main())
