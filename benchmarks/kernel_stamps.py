"""The time the kernel received a socket's bytes (SO_TIMESTAMPNS), for benchmarks/http_e2e.py's two readers.

A reader process that stamps its bytes with time.time() when it gets to them also counts its own queue:
the HTTP client handles 64 connections in one process on the same two cores as the gateway and the engine,
and a chunk that arrives while it is busy with the one before is stamped late. The kernel stamps each
segment as it arrives (Linux: for TCP, the last segment a recvmsg returned), whatever the process is doing.
"""

from __future__ import annotations

import socket
import struct

SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)  # Linux's value where Python does not name it
_ANCILLARY = socket.CMSG_SPACE(16)  # one struct timespec


def stamp_arrivals(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)


def receive(sock: socket.socket, size: int = 1 << 20) -> tuple[bytes, float | None]:
    """One recvmsg: the bytes and the kernel's receive time (seconds since the epoch, as time.time()),
    None where the kernel gave none."""
    data, ancillary, _, _ = sock.recvmsg(size, _ANCILLARY)
    for level, kind, payload in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(payload) >= 16:
            seconds, nanoseconds = struct.unpack("qq", payload[:16])
            return data, seconds + nanoseconds / 1e9
    return data, None
