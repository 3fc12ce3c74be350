"""One TCP link on loopback through the fault proxy, for a test that cuts, restores and resets it.

The proxy is the fault proxy's own :class:`~twinflow.chaos.fault_proxy.Proxy`
(what ``twinflow proxy`` serves over its Toxiproxy API), run on an asyncio
loop of its own in a daemon thread, so a test drives it with plain calls:

- ``cut()`` sets the ``cut`` toxic: a partition that heals. Connections stay
  open and new ones are accepted, but no byte passes, so clients time out
  rather than fail fast; nothing is dropped, and a client accepted meanwhile
  is dialled upstream only once the cut ends.
- ``restore()`` removes it: the held bytes arrive in order.
- ``reset()`` aborts every open connection (clients see a reset or EOF);
  later connections pass as usual unless the link is cut.
- ``stop()`` closes the listener and every connection, and ends the thread.

Promises: binds 127.0.0.1 only; every call waits for the loop at most
``timeout_s`` and raises TimeoutError past it; the thread is a daemon, so a
link nobody stops never holds up the interpreter.

>>> import socket
>>> echo = socket.create_server(("127.0.0.1", 0))
>>> link = FaultLink(echo.getsockname()).start()
>>> client = socket.create_connection(("127.0.0.1", link.port)); peer, _ = echo.accept()
>>> link.cut(); client.sendall(b"hi"); peer.settimeout(0.2); peer.recv(2)
Traceback (most recent call last):
TimeoutError: timed out
>>> link.restore(); peer.settimeout(5); peer.recv(2)
b'hi'
>>> link.stop(), link.connections
(True, 0)
>>> for s in (client, peer, echo): s.close()
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from typing import Any, Awaitable, Callable

from .fault_proxy import Proxy
from .toxics import Toxic

_names = itertools.count(1)


class FaultLink:
    """A link from ``127.0.0.1:listen_port`` (0: any free port) to ``upstream`` (host, port)."""

    def __init__(self, upstream: tuple[str, int], listen_port: int = 0, timeout_s: float = 5.0):
        host, port = upstream
        self.timeout_s = timeout_s
        self.proxy = Proxy(f"link-{next(_names)}", f"127.0.0.1:{listen_port}", f"{host}:{port}")
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-link", daemon=True)

    def start(self) -> "FaultLink":
        """Listen; OSError when the port is taken."""
        self._thread.start()
        self._run(self.proxy.start())
        return self

    @property
    def port(self) -> int:
        return int(self.proxy.listen.rsplit(":", 1)[1])

    @property
    def address(self) -> str:
        return self.proxy.listen

    @property
    def connections(self) -> int:
        """Connections open through the link now (a client held by a cut counts)."""
        if not self._thread.is_alive():
            return 0
        return self._call(lambda: len(self.proxy.connections) + self.proxy.held)

    def cut(self) -> None:
        self._call(lambda: self.proxy.set_toxic(Toxic(name="cut", type="cut")))

    def restore(self) -> None:
        self._call(lambda: self.proxy.remove_toxic("cut") if "cut" in self.proxy.toxics else None)

    def reset(self) -> None:
        self._call(lambda: self.proxy.close_connections(reset=True))

    def stop(self) -> bool:
        """Close the listener and every connection, end the thread; True once it ended."""
        if self._thread.is_alive():
            self._run(self.proxy.stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(self.timeout_s)
        return not self._thread.is_alive()

    def _run(self, coro: Awaitable[Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(self.timeout_s)

    def _call(self, fn: Callable[[], Any]) -> Any:
        async def call() -> Any:
            return fn()
        return self._run(call())
