"""Serving the console over HTTP or HTTPS: :class:`ConsoleServer`.

The server is the standard library's WSGI server with a thread per request (as
prometheus-client serves ``/metrics``): the page polls one JSON snapshot a second, so no
request lives long and a stop ends at once. With a certificate and key it serves HTTPS;
the TLS handshake happens in the request's thread, so a slow client holds up no other.
A peer's console also answers its Prometheus metrics on every path outside ``/console``
(``metrics``): one port to reach for both.

Under failure: an address that cannot be bound raises OSError at start, a TLS file that
cannot be read SecurityConfigError naming it; a non-loopback address without TLS and
tokens is refused before anything binds (:func:`.access.check_console_bind`). A request
that fails is answered 500 and logged; the server goes on.
"""

from __future__ import annotations

import logging
import ssl
import threading
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from socketserver import ThreadingMixIn

from ...grpc_security import GrpcSecurity, SecurityConfigError
from ..metrics import split_address
from .access import check_console_bind

log = logging.getLogger("twinflow.console")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # A client that went away, or spoke plain HTTP to the HTTPS port: its connection ends,
        # the server goes on; a line in the debug log, not a traceback on stderr.
        log.debug("console connection from %s failed", client_address[0], exc_info=True)


class _QuietHandler(WSGIRequestHandler):
    """No access line per request on stderr: the page polls every second."""

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        log.debug("console %s " + format, self.client_address[0], *args)


class ConsoleServer:
    """``app`` served on ``listen`` (``HOST:PORT``; port 0 picks one), HTTPS when ``cert`` and ``key``
    are given; paths outside ``/console`` go to ``metrics`` when given. ``url`` is where it listens."""

    def __init__(self, app: Callable, listen: str, *, security: GrpcSecurity | None = None,
                 cert: str | None = None, key: str | None = None, metrics: Callable | None = None):
        check_console_bind(listen, security, tls=bool(cert and key))
        host, port = split_address(listen)
        context = None
        if cert and key:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                raise SecurityConfigError(f"console TLS: cannot use {cert} and {key}: {exc}") from None

        def routed(environ, start_response):
            path = environ.get("PATH_INFO", "/")
            if metrics is not None and not (path == "/console" or path.startswith("/console/")):
                return metrics(environ, start_response)
            return app(environ, start_response)

        self._httpd = make_server(host, port, routed, server_class=_Server, handler_class=_QuietHandler)
        if context is not None:
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True,
                                                     do_handshake_on_connect=False)
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if context else 'http'}://{shown}:{self._httpd.server_address[1]}/console/"
        self._thread = threading.Thread(target=self._httpd.serve_forever, name="console", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5.0)
