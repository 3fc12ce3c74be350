"""``twinflow console FLOW``: the operator console of one flow's cluster, served until stopped.

It reads the flow's Redis as ``twinflow status`` and ``twinflow failures`` do, and asks
the master over gRPC for a handover as ``twinflow handover`` does, with the flow file's
``security`` section and the flags over it: the console's HTTPS certificate and key, the
read and admin tokens it accepts (and the admin token it sends to the master).

Under failure: a bad flag, an address that cannot be bound, or a non-loopback address
without TLS and tokens ends the command with exit code 2 or ``EXIT_REFUSED``, the reason on
stderr, before anything is served. Redis down later is shown on the page; the console
keeps serving.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path

from twinflow.cli_common import EXIT_REFUSED, _address, _grpc_security, _load_flow


def console_dialling(args):
    """``args`` with the CA the console dials the peers with taken from ``TWINFLOW_TLS_CA`` when
    ``--tls-ca`` is not given, as every operator command reads it (the console's certificate,
    key and tokens are its own: what it serves and accepts, never the operator's variables)."""
    if not args.tls_ca and os.environ.get("TWINFLOW_TLS_CA"):
        args.tls_ca = os.environ["TWINFLOW_TLS_CA"]
    return args


def cmd_console(args) -> int:
    from twinflow.cluster.console.access import ConsoleAccess
    from twinflow.cluster.console.app import ConsoleApp
    from twinflow.cluster.console.server import ConsoleServer
    from twinflow.cluster.console.snapshot import ConsoleView, console_stores
    from twinflow.cluster.handover_request import ask_masters
    from twinflow.grpc_security import SecurityConfigError

    graph = _load_flow(args.flow)
    stores = console_stores(graph, _address(args.redis, "TWINFLOW_REDIS", "redis"), who="console")
    security = _grpc_security(console_dialling(args), graph)
    cert = args.tls_cert or (graph.cluster.security.tls_cert if graph.cluster and graph.cluster.security else None)
    key = args.tls_key or (graph.cluster.security.tls_key if graph.cluster and graph.cluster.security else None)
    app = ConsoleApp(ConsoleView(graph, stores), ConsoleAccess(security),
                     handover=lambda: [a.as_dict() for a in ask_masters(stores, security, args.handover_timeout)],
                     reports=Path(args.reports) if args.reports else None)
    try:
        server = ConsoleServer(app, args.listen, security=security, cert=cert, key=key, hosts=args.allow_host or ())
    except (SecurityConfigError, OSError, ValueError) as exc:
        print(f"twinflow console: refused to start: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    print(f"twinflow console: flow {graph.name} at {server.url}", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    server.stop()
    return 0
