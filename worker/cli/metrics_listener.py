"""The worker's Prometheus listener, bound before the model loads and served once the worker exists.

Several workers on one host (the README's "add workers to scale out") all start with the default port:
a default port that is taken is never fatal, the next free one of a few is taken and the log says which,
or, when all are taken, metrics are not served and the log says so. A port the operator asked for
(`--metrics-port`, CONVEYOR_METRICS_PORT) that is taken stops the worker before a model load is wasted.
It binds loopback unless `--metrics-host` says otherwise (compose and Kubernetes set 0.0.0.0 so
Prometheus and probes reach it).
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import structlog
from prometheus_client import CollectorRegistry, make_wsgi_app

DEFAULT_PORT = 9100
DEFAULT_HOST = "127.0.0.1"
TRIES = 10  # default ports tried: DEFAULT_PORT .. DEFAULT_PORT + TRIES - 1

log = structlog.get_logger("conveyor.worker")


class PortTaken(RuntimeError):
    """An explicitly requested metrics port could not be bound; the message names the option."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight does not hold the process at exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the base class's name)
        """Scrapes are not logged (one line per scrape every few seconds would drown the worker's log)."""


class MetricsListener:
    """A bound server; it answers only after `serve` (until then a scrape waits in the listen backlog)."""

    def __init__(self, server: WSGIServer) -> None:
        self._server = server
        self._app: Callable | None = None
        self.port: int = server.server_address[1]
        server.set_app(self._call)

    def _call(self, environ, start_response):
        assert self._app is not None  # the thread that calls this starts in serve()
        return self._app(environ, start_response)

    def serve(self, registry: CollectorRegistry) -> None:
        self._app = make_wsgi_app(registry)
        log.info("metrics served", host=self._server.server_address[0], port=self.port)
        threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True).start()

    def close(self) -> None:
        if self._app is not None:
            self._server.shutdown()
        self._server.server_close()


def bind_metrics(host: str, port: int, explicit: bool) -> MetricsListener | None:
    """The listener on host:port, or None for port 0. A taken port raises PortTaken when `explicit`,
    else the next ports are tried and one line is logged (None when all of them are taken)."""
    if port == 0:
        return None
    ports = [port] if explicit else range(port, port + TRIES)
    error: OSError | None = None
    for candidate in ports:
        try:
            listener = MetricsListener(_bind(host, candidate))
        except OSError as exc:
            error = exc
            continue
        if candidate != port:
            log.warning(
                "metrics port taken, serving on the next free one", taken=port, port=candidate, host=host
            )
        return listener
    assert error is not None
    if explicit:
        raise PortTaken(
            f"--metrics-port {port}: cannot listen on {host}:{port} ({error.strerror}); "
            "choose another port, or 0 for no metrics listener"
        )
    log.warning(
        "metrics not served: every default port is taken (set --metrics-port)",
        ports=f"{port}-{port + TRIES - 1}",
        host=host,
    )
    return None


def _bind(host: str, port: int) -> WSGIServer:
    server_class = type("_Server", (_Server,), {"address_family": _family(host)})
    return make_server(host, port, lambda environ, start: [], server_class, handler_class=_Quiet)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET
