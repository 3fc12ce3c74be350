"""A peer serving the console (``twinflow run --console-listen HOST:PORT``).

The console a peer serves is the one ``twinflow console`` serves, on the peer's own terms:
its flow, its Redis (connections of the console's own, so that a poll never waits behind
a batch), its TLS certificate and key (HTTPS when the peer has them), its tokens (read and
admin: the flow file's ``security.tokens``), and its Prometheus metrics on every path
outside ``/console`` when the peer serves metrics. Any peer of the flow shows the whole
cluster: a worker's console is as good as the master's, and stays up through a failover.

Under failure: an address that cannot be bound, or a non-loopback one without TLS and
tokens, refuses the peer's start (StartRefused) before anything else starts.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from prometheus_client import make_wsgi_app

from ...grpc_security import SecurityConfigError
from ...logs import event
from ..handover_request import ask_masters
from ..on_cluster import StartRefused
from .access import ConsoleAccess
from .app import ConsoleApp
from .server import ConsoleServer
from .snapshot import ConsoleView, console_stores

if TYPE_CHECKING:
    from ..peer import Peer

log = logging.getLogger("twinflow.console")
HANDOVER_TIMEOUT_S = 10.0


def serve_console(peer: "Peer") -> ConsoleServer:
    """Serve the console of ``peer``'s flow on ``peer.cfg.console_listen``; the caller stops it."""
    cfg = peer.cfg
    security = cfg.security
    stores = console_stores(peer.graph, cfg.redis_url, who=f"{cfg.peer_id}-console")
    app = ConsoleApp(ConsoleView(peer.graph, stores, clock=time.time), ConsoleAccess(security),
                     handover=lambda: [a.as_dict() for a in ask_masters(stores, security, HANDOVER_TIMEOUT_S)])
    tls = security.tls
    try:
        server = ConsoleServer(app, cfg.console_listen, security=security, hosts=cfg.console_hosts,
                               cert=tls.cert if tls else None, key=tls.key if tls else None,
                               metrics=make_wsgi_app(peer.metrics.registry) if peer.metrics else None)
    except (OSError, ValueError, SecurityConfigError) as exc:
        raise StartRefused(f"cannot serve the console on {cfg.console_listen}: {exc}") from exc
    event(log, logging.INFO, "console", "%s serves the console on %s", cfg.peer_id, server.url, flow=peer.name,
          peer=cfg.peer_id, url=server.url)
    return server
