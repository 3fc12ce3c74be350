"""An HTTP(S) server for a WSGI application in which no client can hold more than its share:
:class:`BoundedHttpServer`.

Connections wait for their request on one event loop (asyncio, in one thread of its own):
an idle connection costs a file descriptor and a small object, never a thread. A request read
whole (:mod:`.request_bounds`) goes to the application on a pool of ``Limits.workers``
threads, through the standard library's request parsing and WSGI handler; its answer is
written back by the loop. One request per connection, as HTTP/1.0: the answer ends it.

What it promises, under load and under failure:

- At most ``cap`` connections are held at once: ``Limits.connections``, or fewer when the
  process's file limit leaves less (:func:`connection_cap`: a quarter of the descriptors the
  process has not used, so that a peer keeps the rest for Redis, ZooKeeper and gRPC). A new
  connection past the cap closes the one that has waited longest for its request; only when
  every held connection is being answered is the new one closed instead. Silent or slow
  clients cannot keep a new client out, nor take the process's last descriptors.
- Every stage has a deadline: the TLS handshake ``handshake_s``, the whole request from the
  connection's start ``request_s`` (a client that trickles bytes is cut off like one that sends
  none; 408 when it can still be told), the answer's write ``write_s``.
- A request past its bounds is refused before the application runs (414, 431, 413, 411, 400:
  :mod:`.request_bounds`), and so is one the standard library cannot parse (400, 505): each
  refusal carries the console's security headers (:mod:`.headers`).
- An accept that fails for want of descriptors (EMFILE, ENFILE) pauses accepting for a second
  (asyncio's back-off) and closes the longest-waiting connection: no spinning on a listening
  socket that stays readable.
- ``stop`` closes the listening socket and every connection, and returns within seconds.
"""

from __future__ import annotations

import asyncio
import errno
import io
import logging
import os
import resource
import socket
import ssl
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler

from .headers import SECURITY_HEADERS, plain_answer
from .request_bounds import Bounds, Refusal, examine

log = logging.getLogger("twinflow.console")

MIN_CONNECTIONS = 8      # held at once even under a tight file limit: a few operators and a scraper
ACCEPTS_PER_TICK = 16    # connections accepted per turn of the loop (the cap is checked between turns)
LISTEN_BACKLOG = 1024    # connections the kernel queues for us meanwhile
LINGER_S = 1.0           # after a refusal, unread bytes are drained this long so the client reads it
_OUT_OF_FILES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


@dataclass(frozen=True)
class Limits:
    """The server's bounds: connections held and requests answered at once, each stage's deadline,
    and a request's size (:class:`.request_bounds.Bounds`)."""

    connections: int = 256
    workers: int = 8
    handshake_s: float = 5.0
    request_s: float = 10.0
    write_s: float = 10.0
    bounds: Bounds = Bounds()


def connection_cap(wanted: int) -> int:
    """``wanted``, or fewer when this process's file limit leaves less (see the module doc)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:  # no /proc: count what is commonly open in a peer
        used = 64
    return max(MIN_CONNECTIONS, min(wanted, (soft - used) // 4))


class BoundedHttpServer:
    """``app`` (WSGI) served on the listening socket ``sock``, over TLS with ``tls``; ``environ``
    is added to every request's environ. It serves from construction until :meth:`stop`."""

    def __init__(self, app: Callable, sock: socket.socket, *, tls: ssl.SSLContext | None = None,
                 limits: Limits = Limits(), environ: dict | None = None, name: str = "console"):
        self.app, self.limits, self.tls = app, limits, tls
        self.cap = connection_cap(limits.connections)
        host, port = sock.getsockname()[:2]
        self._environ = {"SERVER_NAME": host, "SERVER_PORT": str(port), "GATEWAY_INTERFACE": "CGI/1.1",
                         "SCRIPT_NAME": "", "CONTENT_LENGTH": "", **({"HTTPS": "on"} if tls else {}),
                         **(environ or {})}
        self.refused_connections = 0    # closed at once: every held connection was being answered
        self.evicted = 0                # closed to make room for a newer one
        self._waiting: dict[_Connection, None] = {}  # held, still reading their request; oldest first
        self._held: set[_Connection] = set()
        self._pool = ThreadPoolExecutor(limits.workers, thread_name_prefix=f"{name}-request")
        self._loop = asyncio.new_event_loop()
        self._loop.set_exception_handler(self._loop_error)
        self._last_warned = 0.0
        self._server = self._loop.run_until_complete(
            self._loop.create_server(lambda: _Connection(self), sock=sock, backlog=ACCEPTS_PER_TICK))
        # asyncio accepts as many per turn as its backlog says; the kernel may queue more meanwhile.
        sock.listen(LISTEN_BACKLOG)
        self._thread = threading.Thread(target=self._loop.run_forever, name=name, daemon=True)
        self._thread.start()

    # -- connections, on the loop ---------------------------------------------
    def _admit(self, conn: "_Connection") -> bool:
        if len(self._held) >= self.cap and not self._evict_one():
            self.refused_connections += 1
            return False
        self._held.add(conn)
        self._waiting[conn] = None
        return True

    def _evict_one(self) -> bool:
        """Close the connection that has waited longest for its request; False when none waits."""
        for oldest in self._waiting:
            self.evicted += 1
            self._forget(oldest)
            oldest.close_now()
            return True
        return False

    def _forget(self, conn: "_Connection") -> None:
        self._waiting.pop(conn, None)
        self._held.discard(conn)

    def _dispatch(self, conn: "_Connection", raw: bytes) -> None:
        self._waiting.pop(conn, None)  # being answered: no longer the one to close for a newer client
        try:
            self._pool.submit(self._answer, conn, raw)
        except RuntimeError:  # the pool is shut: the server is stopping
            conn.close_now()

    def _answer(self, conn: "_Connection", raw: bytes) -> None:
        """On a worker thread: the application's answer to ``raw``, handed back to the loop."""
        try:
            answer = _request(raw, conn, self)
        except Exception:  # the server must answer whatever broke
            log.exception("console request from %s failed", conn.peer[0])
            answer = plain_answer(500, "the server failed; see its log")
        try:
            self._loop.call_soon_threadsafe(conn.send, answer, False)
        except RuntimeError:  # the loop is closed: the server stopped meanwhile
            pass

    def _loop_error(self, loop, context: dict) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in _OUT_OF_FILES:
            # asyncio stops accepting for a second (no spinning on a socket that stays readable);
            # the longest-waiting connection makes room for the next one.
            self._evict_one()
            now = time.monotonic()
            if now - self._last_warned > 60:
                self._last_warned = now
                log.warning("the console cannot accept connections for now: %s (the process's file limit); "
                            "it holds %d, and tries again in a second", exc.strerror, len(self._held))
            return
        log.debug("console connection failed: %s", context.get("message"), exc_info=exc)

    # -- the owner's calls -----------------------------------------------------
    @property
    def held(self) -> int:
        return len(self._held)

    def stop(self) -> None:
        """Close the listening socket and every connection; return within seconds."""
        if self._loop.is_closed():
            return

        def shut() -> None:
            self._server.close()
            for conn in list(self._held):
                conn.close_now()
            self._held.clear()
            self._waiting.clear()
            self._loop.call_soon(self._loop.stop)

        try:
            self._loop.call_soon_threadsafe(shut)
        except RuntimeError:
            pass
        self._thread.join(5.0)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if not self._thread.is_alive():
            self._loop.close()


class _Connection(asyncio.Protocol):
    """One client's connection, on the server's loop: its request read within bounds and time,
    then its answer written, then closed (see the module doc)."""

    def __init__(self, server: BoundedHttpServer):
        self.server = server
        self.transport: asyncio.BaseTransport | None = None
        self.peer: tuple = ("?", 0)
        self.local: tuple = ("?", 0)
        self.data = bytearray()
        self.state = "reading"   # reading, answering, writing, draining, closed
        self._timer: asyncio.TimerHandle | None = None
        self._tls_task: asyncio.Task | None = None

    def connection_made(self, transport) -> None:
        if self.transport is not None:  # TLS: the same protocol, now on the TLS transport
            return
        self.transport = transport
        self.peer = transport.get_extra_info("peername") or ("?", 0)
        self.local = transport.get_extra_info("sockname") or ("?", 0)
        server = self.server
        if not server._admit(self):
            self.state = "closed"
            transport.abort()
            return
        loop = server._loop
        self._timer = loop.call_later(server.limits.request_s, self._too_slow)
        if server.tls is not None:
            # No byte is read before the handshake takes the connection over.
            transport.pause_reading()
            self._tls_task = loop.create_task(self._handshake())

    async def _handshake(self) -> None:
        server = self.server
        try:
            self.transport = await server._loop.start_tls(self.transport, self, server.tls, server_side=True,
                                                          ssl_handshake_timeout=server.limits.handshake_s)
        except (OSError, ssl.SSLError, asyncio.CancelledError, ConnectionError) as exc:
            # A client that spoke plain HTTP, went away, or took too long: nothing to answer.
            log.debug("console TLS handshake with %s failed: %s", self.peer[0], exc)
            self.close_now()
            return
        if self.state == "closed":  # evicted or stopped during the handshake
            self.transport.abort()

    def data_received(self, data: bytes) -> None:
        if self.state == "draining":
            return
        if self.state != "reading":
            return
        self.data += data
        found = examine(bytes(self.data), self.server.limits.bounds)
        if found is None:
            return
        if isinstance(found, Refusal):
            self.send(plain_answer(found.status, found.why), True)
            return
        self.state = "answering"
        self.transport.pause_reading()
        self.server._dispatch(self, bytes(self.data[:found]))
        self.data = bytearray()

    def eof_received(self):
        if self.state == "reading":  # the client stopped sending before its request was whole
            self.close_now()
        elif self.state == "draining":
            self._close_after_write()
        return True  # keep our side open to write the answer

    def _too_slow(self) -> None:
        if self.state == "reading":
            handshaken = self.server.tls is None or self._tls_task is None or self._tls_task.done()
            if handshaken and self.data:
                self.send(plain_answer(408, f"the request did not arrive whole within "
                                            f"{self.server.limits.request_s:g} s"), False)
            else:  # nothing sent: a silent client is closed without a word
                self.close_now()
        elif self.state in ("writing", "draining"):
            self.close_now()

    def send(self, answer: bytes, refused: bool) -> None:
        """Write ``answer`` and close; a refusal first drains what the client still sends (for
        ``LINGER_S``), so that the client reads the answer rather than a reset."""
        if self.state in ("closed", "writing", "draining") or self.transport is None:
            return
        self.server._forget(self)
        if self._timer is not None:
            self._timer.cancel()
        self.transport.write(answer)
        if not refused:
            self._close_after_write()
            return
        self.state = "draining"
        if self.transport.can_write_eof():
            self.transport.write_eof()
        if not self.transport.is_reading():
            self.transport.resume_reading()
        self._timer = self.server._loop.call_later(LINGER_S, self._close_after_write)

    def _close_after_write(self) -> None:
        if self.state == "closed":
            return
        self.state = "writing"
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.server._loop.call_later(self.server.limits.write_s, self.close_now)
        self.transport.close()  # once what is written is sent; close_now if that takes past write_s

    def close_now(self) -> None:
        self.server._forget(self)
        if self.state != "closed" and self.transport is not None:
            self.state = "closed"
            self.transport.abort()
        self.state = "closed"
        if self._timer is not None:
            self._timer.cancel()

    def connection_lost(self, exc) -> None:
        self.server._forget(self)
        self.state = "closed"
        if self._timer is not None:
            self._timer.cancel()


class _Handler(WSGIRequestHandler):
    """The standard library's parsing and WSGI call, on a request already read whole, with the
    answer kept in memory; its own refusals (400, 431, 505) carry the security headers."""

    # A request line the library cannot read would be answered as HTTP/0.9, a body without
    # headers: as HTTP/1.0, the refusal has its status line and the security headers.
    default_request_version = "HTTP/1.0"

    def setup(self) -> None:
        self.rfile = io.BytesIO(self.request)
        self.wfile = io.BytesIO()
        self._errors = io.StringIO()

    def finish(self) -> None:
        errors = self._errors.getvalue()
        if errors:
            log.warning("console request from %s: %s", self.client_address[0], errors.strip())

    def get_stderr(self):
        return self._errors

    def get_environ(self) -> dict:
        environ = super().get_environ()
        environ.update(self.server.extra)
        return environ

    def end_headers(self) -> None:  # only the handler's own answers (send_error) pass here
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        super().end_headers()

    def log_message(self, format, *args):  # noqa: A002 (the base class's name)
        log.debug("console %s " + format, self.client_address[0], *args)


class _Site:
    """What :class:`_Handler` asks of its server: the base environ and the application."""

    def __init__(self, app: Callable, base: dict, extra: dict):
        self.base_environ, self._app, self.extra = base, app, extra

    def get_app(self) -> Callable:
        return self._app


def _request(raw: bytes, conn: _Connection, server: BoundedHttpServer) -> bytes:
    """The whole answer of the server's application to the request ``raw`` that came on ``conn``.
    The environ has ``twinflow.server_ip``: the address the connection came in on."""
    site = _Site(server.app, server._environ, {"twinflow.server_ip": str(conn.local[0])})
    handler = _Handler.__new__(_Handler)  # not __init__: it would read a socket
    handler.request, handler.client_address, handler.server = raw, (str(conn.peer[0]), conn.peer[1]), site
    handler.setup()
    try:
        handler.handle()
    finally:
        handler.finish()
    return handler.wfile.getvalue() or plain_answer(500, "the server gave no answer")
