"""The lab's console on this machine: a port on 127.0.0.1 forwarded to a lab peer's console.

Each lab peer serves the operator console on its host (``--console-listen 0.0.0.0:8470``,
HTTPS with its ``peer-X.lab`` certificate and the lab's tokens). The lab's network has no
route from this machine's own namespace, so :class:`ConsoleForward` listens on this machine
and opens each connection from inside the lab's client host (``lab_network.connect_in``),
copying bytes both ways: TLS stays end to end between the browser and the peer.

Under failure: a connection the peer refuses or that drops is closed on both sides; the
forward goes on serving the next one. ``stop`` closes the listener and every open pair.
"""

from __future__ import annotations

import socket
import socketserver
import threading

from .lab_network import connect_in

CONSOLE_PORT = 8470  # where each lab peer serves its console, on its own host


class ConsoleForward:
    """``listen`` (``(host, port)``; port 0 picks one) forwarded to ``address:port`` as seen from namespace ``ns``."""

    def __init__(self, ns: str, address: str, port: int = CONSOLE_PORT, listen: tuple[str, int] = ("127.0.0.1", 0)):
        target = (ns, address, port)

        class Pair(socketserver.BaseRequestHandler):
            def handle(self):
                try:
                    upstream = connect_in(*target, timeout_s=5)
                except OSError:
                    return
                upstream.settimeout(None)
                with upstream:
                    back = threading.Thread(target=_pump, args=(upstream, self.request), daemon=True)
                    back.start()
                    _pump(self.request, upstream)
                    back.join(30)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(listen, Pair)
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="lab-console", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until ``source`` ends, then end ``sink``'s writing side."""
    try:
        while chunk := source.recv(65536):
            sink.sendall(chunk)
    except OSError:
        pass
    try:
        sink.shutdown(socket.SHUT_WR)
    except OSError:
        pass
