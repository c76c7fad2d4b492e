"""uvicorn's HTTP protocol, with a response's status line and headers sent in one write with its first body.

uvicorn writes a response's header block to the socket as soon as the app sends `http.response.start`,
and each body as it is sent: a short answer is two writes (a JSON answer: headers, then body; a stream's
first chunk: headers, then the chunk). On loopback TCP a write costs ~7 µs on a quiet 2-core VM and
more while the engine computes, much of it the receiver's side of TCP, which Linux runs inside the
sender's system call; when the engine starts 50 jobs in one step, their 50 first chunks go out one after
another in one pass (sse.py). Here the header block waits for the connection's next write and goes out
in it; if none comes in the same turn of the loop (a 100 Continue, a response whose body is not ready),
it goes out on its own at the next turn. Bytes and their order on the connection are unchanged.
benchmarks/held_headers.py: 3 writes per short streamed answer -> 2, the server's CPU per answer 0.88x.
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.auto import AutoHTTPProtocol

# How uvicorn (httptools and h11 alike) begins the header block of a response, and of a 100 Continue.
_STATUS_LINE = b"HTTP/"


class HeldHeaders:
    """An asyncio transport whose writes of a header block are held until the next write, or the loop's
    next turn. Everything but writing (flow control, peer names, closing) is the wrapped transport's."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        # What uvicorn calls on every request, bound here: found without a trip through __getattr__.
        self.is_closing, self.get_extra_info = transport.is_closing, transport.get_extra_info
        self.pause_reading, self.resume_reading = transport.pause_reading, transport.resume_reading

    def write(self, data: Any) -> None:
        if self._held is not None:
            data, self._held = self._held + data, None
            self._transport.write(data)
        elif data[: len(_STATUS_LINE)] == _STATUS_LINE:
            # A body that happens to start so is only held as well: sent in order either way.
            self._held = bytes(data)
            asyncio.get_running_loop().call_soon(self.flush)
        else:
            self._transport.write(data)

    def flush(self) -> None:
        if self._held is not None:
            data, self._held = self._held, None
            self._transport.write(data)

    def writelines(self, lines: Any) -> None:
        self.flush()
        self._transport.writelines(lines)

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + len(self._held or b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class HeldHeadersProtocol(AutoHTTPProtocol):  # type: ignore[valid-type,misc]  # a class chosen at import
    """uvicorn's own HTTP protocol (httptools when installed, else h11) over a HeldHeaders transport."""

    def connection_made(self, transport: asyncio.Transport) -> None:
        super().connection_made(HeldHeaders(transport))
