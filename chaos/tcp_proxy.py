"""A TCP link on loopback that tests and drills can cut, reset and restore.

``TcpProxy`` listens on 127.0.0.1 and pipes each connection to ``upstream``.
Faults apply to the whole link, both directions:

- ``cut()`` blackholes it, as a partition that drops packets does: connections
  stay open and new ones are accepted, but no byte passes, so clients time out
  rather than fail fast. Bytes sent meanwhile are held, not discarded; a
  connection accepted during the cut is dialled upstream only when it ends.
- ``restore()`` ends the cut. Connections that lived through it are not closed:
  they resume and the held bytes arrive in order, as TCP delivers them once a
  partition heals. To end those connections instead, ``reset()`` first.
- ``reset()`` aborts every open connection at once (clients see a reset or EOF);
  later connections forward as usual unless the link is cut.

Promises: binds 127.0.0.1 only; one accept thread plus two per open connection,
each ending by itself when its connection closes; all are daemons, so a proxy
nobody stops never holds up the interpreter; ``stop()`` closes the listener and
every connection and joins every thread within its timeout.

>>> import socket
>>> echo = socket.create_server(("127.0.0.1", 0))
>>> proxy = TcpProxy(echo.getsockname()).start()
>>> client = socket.create_connection(("127.0.0.1", proxy.port)); peer, _ = echo.accept()
>>> proxy.cut(); client.sendall(b"hi"); peer.settimeout(0.2); peer.recv(2)
Traceback (most recent call last):
TimeoutError: timed out
>>> proxy.restore(); peer.settimeout(5); peer.recv(2)
b'hi'
>>> proxy.stop(), proxy.connections
(True, 0)
>>> for s in (client, peer, echo): s.close()
"""

from __future__ import annotations

import socket
import struct
import threading
import time
from contextlib import suppress
from dataclasses import dataclass

_CHUNK = 65536
_DIAL_TIMEOUT_S = 5.0
_ABORT = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST


@dataclass(eq=False)
class _Link:
    """One client connection and, once dialled, its upstream connection."""

    client: socket.socket
    dropped: bool
    upstream: socket.socket | None = None

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class TcpProxy:
    """Forwards 127.0.0.1:``listen_port`` (0: any free port) to ``upstream``."""

    def __init__(self, upstream: tuple[str, int], listen_port: int = 0) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", listen_port))
        self.port: int = self._listener.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self._lock = threading.Condition()  # guards everything below; wakes held pumps
        self._links: set[_Link] = set()
        self._threads: list[threading.Thread] = []
        self._cut = False
        self._stopped = False

    def start(self) -> "TcpProxy":
        self._spawn(self._accept)
        return self

    @property
    def connections(self) -> int:
        """Client connections accepted and not yet closed (held ones included)."""
        with self._lock:
            return len(self._links)

    def cut(self) -> None:
        """Blackhole the link: nothing passes, nothing is closed."""
        with self._lock:
            self._cut = True

    def restore(self) -> None:
        """End a cut: held bytes and held connections go through."""
        with self._lock:
            self._cut = False
            self._lock.notify_all()

    def reset(self) -> None:
        """Abort every open connection now (RST to the client)."""
        with self._lock:
            for link in list(self._links):
                self._drop(link, abort=True)

    def stop(self, timeout_s: float = 5.0) -> bool:
        """Close the listener and every connection; True if every thread ended in time."""
        with self._lock:
            self._stopped = True
            for link in list(self._links):
                self._drop(link)
        with suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
        self._listener.close()
        deadline = time.monotonic() + timeout_s
        while True:  # re-read: a thread may spawn another before it ends
            with self._lock:
                alive = [t for t in self._threads if t.is_alive()]
            left = deadline - time.monotonic()
            if not alive or left <= 0:
                return not alive
            alive[0].join(left)

    def _spawn(self, target, *args) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True,
                                  name=f"tcp-proxy-{self.port}")
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()] + [thread]
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            self._spawn(self._serve, client)

    def _serve(self, client: socket.socket) -> None:
        with self._lock:
            link = _Link(client, dropped=self._stopped)
            self._links.add(link)
        try:
            if not self._hold(link):
                return
            # Refused or unreachable upstream: the client sees its connection close.
            upstream = socket.create_connection(self.upstream, timeout=_DIAL_TIMEOUT_S)
            upstream.settimeout(None)
            with self._lock:
                link.upstream = upstream
                if link.dropped:
                    return
            back = threading.Thread(target=self._pump, args=(link, upstream, client),
                                    daemon=True, name=f"tcp-proxy-{self.port}")
            back.start()
            self._pump(link, client, upstream)
            back.join()
        except OSError:
            pass
        finally:
            with self._lock:
                self._drop(link)
                self._links.discard(link)
            for sock in link.sockets():
                sock.close()

    def _hold(self, link: _Link) -> bool:
        """Wait out a cut; False if the link was dropped meanwhile."""
        with self._lock:
            self._lock.wait_for(lambda: not self._cut or link.dropped)
            return not link.dropped

    def _pump(self, link: _Link, src: socket.socket, dst: socket.socket) -> None:
        try:
            while (data := src.recv(_CHUNK)) and self._hold(link):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            with self._lock:
                self._drop(link)

    def _drop(self, link: _Link, abort: bool = False) -> None:
        """Wake both pumps of ``link`` (caller holds the lock); its owner then closes it."""
        link.dropped = True
        for sock in link.sockets():
            with suppress(OSError):
                if abort and sock is link.client:
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _ABORT)
                sock.shutdown(socket.SHUT_RDWR)
        self._lock.notify_all()
