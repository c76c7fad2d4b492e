"""A TCP proxy on loopback that injects network faults between a client (a worker) and redis-server.

Modes, switched at any time with `set(mode)`:
    pass       forward both ways
    latency    forward, each chunk after `latency_s`
    stall      stop forwarding but keep every connection open; what was held is delivered once cleared
               (a frozen network: reads hang until the reader's own timeout)
    blackhole  drop every byte and never close: each connection open now (or opened meanwhile) stays
               silent for good, as when the peer vanished without a RST; after `set("pass")` only new
               connections work (a client notices only by its own timeout)
    reset      reset every connection (RST), and every new one at once

Threads: one accepting, two pumps per connection. Every socket is closed by `close()`.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

_CHUNK = 65536
_POLL_S = 0.02


class FaultProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.mode, self.latency_s = "pass", 0.0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(_POLL_S * 5)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = threading.Event()
        threading.Thread(target=self._accept, name="fault-proxy", daemon=True).start()

    def url(self, auth: str = "") -> str:
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def set(self, mode: str, latency_s: float = 0.0) -> None:
        assert mode in ("pass", "latency", "stall", "blackhole", "reset"), mode
        self.mode, self.latency_s = mode, latency_s
        if mode == "reset":
            with self._lock:
                sockets, self._sockets = self._sockets, []
            for s in sockets:
                _reset(s)

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            _reset(s)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                inbound, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed (close() closes the listener under it); anything else is shown
                if not self._closed.is_set():
                    import traceback

                    traceback.print_exc()
                return
            if self.mode == "reset":
                _reset(inbound)
                continue
            try:
                outbound = socket.create_connection(self.target, timeout=2)
            except OSError:
                _reset(inbound)
                continue
            with self._lock:
                self._sockets += [inbound, outbound]
            dead = threading.Event()  # blackholed: both directions silent for good
            for src, dst in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(src, dst, dead), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, dead: threading.Event) -> None:
        src.settimeout(_POLL_S)
        while not self._closed.is_set():
            if self.mode == "blackhole":
                dead.set()
            try:
                data = src.recv(_CHUNK)
            except TimeoutError:
                continue
            except OSError:
                break
            if not data:
                break
            while self.mode == "stall" and not self._closed.is_set():
                time.sleep(_POLL_S)
            if dead.is_set() or self.mode == "blackhole":
                dead.set()
                continue
            if self.mode == "latency":
                time.sleep(self.latency_s)
            try:
                dst.sendall(data)
            except OSError:
                break
        _reset(dst)


def _reset(s: socket.socket) -> None:
    """Close with SO_LINGER 0: the peer gets a RST (a reset), not an orderly FIN."""
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    s.close()
