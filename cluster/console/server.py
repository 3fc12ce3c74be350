"""Serving the console over HTTP or HTTPS: :class:`ConsoleServer`.

The server is :class:`.bounded_http.BoundedHttpServer`: connections wait for their request on
an event loop, a request read whole is answered on a small pool of threads, and every stage
has a deadline and every request a size (its module doc says what each limit is). With a
certificate and key it serves HTTPS. A peer's console also answers its Prometheus metrics on
every path outside ``/console`` (``metrics``): one port to reach for both.

Every request must name this console in its ``Host`` (:mod:`.host_check`: the address it
was dialled at, ``localhost`` on loopback, its certificate's names, the names given in
``hosts``), the metrics' too: a page of another site that rebinds its name to this address
is refused (421). Every answer, the metrics' and the refusals' included, carries the
console's security headers (:mod:`.headers`).

Under failure: an address that cannot be bound raises OSError at start, a TLS file that
cannot be read SecurityConfigError naming it; a non-loopback address without TLS and
tokens is refused before anything binds (:func:`.access.check_console_bind`), and one the
operator allowed with ``--insecure`` is warned about at start and every minute
(:mod:`.insecure`). A request that fails is answered 500 and logged; the server goes on.
Idle, slow or too many clients are closed at their deadline or to make room; they cannot
take the server's threads, nor the process's file descriptors.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from typing import Callable, Iterable

from ...grpc_security import GrpcSecurity, SecurityConfigError
from ..metrics import split_address
from .access import check_console_bind
from .bounded_http import BoundedHttpServer, Limits
from .headers import reason, with_security
from .host_check import AllowedHosts, certificate_names
from .insecure import insecure_reason, warn_insecure

log = logging.getLogger("twinflow.console")


class ConsoleServer:
    """``app`` served on ``listen`` (``HOST:PORT``; port 0 picks one), HTTPS when ``cert`` and ``key``
    are given; paths outside ``/console`` go to ``metrics`` when given. ``hosts``: more names a
    request's ``Host`` may give; ``limits``: the server's bounds; ``insecure_wait``: the timer of
    the ``--insecure`` warning (a test's). ``url`` is where it listens."""

    def __init__(self, app: Callable, listen: str, *, security: GrpcSecurity | None = None,
                 cert: str | None = None, key: str | None = None, metrics: Callable | None = None,
                 hosts: Iterable[str] = (), limits: Limits = Limits(),
                 insecure_wait: Callable[[float], bool] | None = None):
        tls = bool(cert and key)
        check_console_bind(listen, security, tls=tls)
        host, port = split_address(listen)
        context = None
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.minimum_version = ssl.TLSVersion.TLSv1_2
            try:
                context.load_cert_chain(cert, key)
            except (OSError, ssl.SSLError) as exc:
                raise SecurityConfigError(f"console TLS: cannot use {cert} and {key}: {exc}") from None
        self.hosts = AllowedHosts(host, [*hosts, *(certificate_names(cert) if tls else [])])

        def routed(environ, start_response):
            def secured(status, headers, exc_info=None):
                return start_response(status, with_security(list(headers)), exc_info)

            if not self.hosts.allows(environ.get("HTTP_HOST"), environ.get("twinflow.server_ip")):
                return _refuse_host(environ, secured, self.hosts)
            path = environ.get("PATH_INFO", "/")
            if metrics is not None and not (path == "/console" or path.startswith("/console/")):
                return metrics(environ, secured)
            return app(environ, secured)

        family, address = _bind_address(host, port)
        sock = socket.create_server(address, family=family, dualstack_ipv6=False)
        try:
            self._http = BoundedHttpServer(routed, sock, tls=context, limits=limits)
        except BaseException:
            sock.close()
            raise
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{'https' if context else 'http'}://{shown}:{sock.getsockname()[1]}/console/"
        self._stop = threading.Event()
        warning = insecure_reason(listen, security, tls)
        if warning:
            warn_insecure(warning, self._stop, wait=insecure_wait)

    @property
    def held(self) -> int:
        """Connections held now (each waiting for its request or being answered)."""
        return self._http.held

    def stop(self) -> None:
        self._stop.set()
        self._http.stop()


def _bind_address(host: str, port: int) -> tuple[socket.AddressFamily, tuple]:
    """The family and address to bind ``host``: an IP literal as it is, a name as it resolves."""
    found = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    family, _, _, _, address = found[0]
    return family, address[:2]


def _refuse_host(environ: dict, start_response, hosts: AllowedHosts) -> list[bytes]:
    # Not the Host sent back: the refusal names what the console takes, nothing the client chose.
    body = (f"this console does not answer to the Host this request names; it answers to "
            f"{hosts.describe()} (twinflow console --allow-host NAME, twinflow run --console-allow-host NAME)\n"
            ).encode()
    log.info("console refused a request from %s for another Host: %s", environ.get("REMOTE_ADDR", "?"),
             environ.get("HTTP_HOST", "(none)"))
    start_response(f"421 {reason(421)}", [("Content-Type", "text/plain; charset=utf-8"),
                                          ("Content-Length", str(len(body)))])
    return [body]
