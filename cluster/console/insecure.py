"""The warning of a console the operator allowed to serve off loopback without TLS or tokens
(``--insecure``): at start and every minute while it serves, as a peer's gRPC server warns.

Under failure: the warning is a log line; nothing here refuses or stops anything (the bind
rules are :func:`.access.check_console_bind`'s).

>>> from twinflow.grpc_security import GrpcSecurity
>>> insecure_reason("0.0.0.0:8470", GrpcSecurity(insecure=True), tls=False)
'the console on 0.0.0.0:8470 is served without TLS and tokens: anyone who reaches it can read failed messages, resubmit them and hand the master role over'
>>> insecure_reason("127.0.0.1:8470", GrpcSecurity(insecure=True), tls=False) is None  # only this machine
True
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from ...grpc_security import INSECURE_WARNING_EVERY_S, GrpcSecurity, is_loopback
from .access import ConsoleAccess

log = logging.getLogger("twinflow.console")


def insecure_reason(listen: str, security: GrpcSecurity | None, tls: bool) -> str | None:
    """What is missing when ``--insecure`` let the console serve ``listen`` without TLS or tokens;
    None when nothing is (loopback, or TLS and tokens after all)."""
    if security is None or not security.insecure or is_loopback(listen):
        return None
    missing = [what for what, has in (("TLS", tls), ("tokens", not ConsoleAccess(security).open)) if not has]
    if not missing:
        return None
    return (f"the console on {listen} is served without {' and '.join(missing)}: anyone who reaches it can "
            f"read failed messages, resubmit them and hand the master role over")


def warn_insecure(reason: str, stop: threading.Event, every_s: float = INSECURE_WARNING_EVERY_S,
                  wait: Callable[[float], bool] | None = None) -> threading.Thread:
    """Log ``reason`` now and every ``every_s`` until ``stop`` is set; ``wait`` (``stop.wait`` by
    default) is the timer, given by a test so that it needs no real minute."""
    wait = wait or stop.wait

    def loop() -> None:
        while True:
            log.warning("--insecure: %s", reason)
            if wait(every_s):
                return

    thread = threading.Thread(target=loop, name="console-insecure-warning", daemon=True)
    thread.start()
    return thread
