"""Who may look at the console and who may act from it, with the peers' own tokens.

A request carries a token as ``Authorization: Bearer <token>``, as a gRPC call does. When
the console has tokens (the flow file's ``security.tokens``, or ``--token``), a ``read``
token may look at everything, an ``admin`` token (the operator's) may also act: resubmit
failed messages and hand the master role over. Any other token, or none, is refused with
one answer (401 and the same reason), whether or not the token is valid for another scope:
a refusal tells a caller nothing about its token. A console without tokens serves loopback
only (:func:`check_console_bind`): then whoever reaches it is on the machine, and may do both.

An action also needs the header ``X-Twinflow-Console``: a web page of another origin cannot
send it without the browser asking first (CORS), and the console never agrees, so a page
elsewhere cannot make an operator's browser act.

Who did an action: the name the operator gave at sign-in (``X-Twinflow-Operator``; the
operator's own word) and the fingerprint of the token used (:func:`token_fingerprint`:
which token, never the token), e.g. ``alice (token 3f2a1c9d)``. It goes into the audit's
RESUBMITTED mark and into the ``console_action`` log event.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...grpc_security import GrpcSecurity, SecurityConfigError, is_loopback, token_fingerprint

READ, ACT = "read", "act"
REFUSED = "sign in with a read or admin token of this flow"
ACTION_HEADER = "HTTP_X_TWINFLOW_CONSOLE"
_NAME = re.compile(r"[^\w .@-]")


@dataclass(frozen=True)
class Caller:
    """What a request may do: ``status`` 200, or 401/403 with ``reason``; ``who`` for the logs."""

    status: int
    reason: str = ""
    may_act: bool = False
    who: str = "anonymous"


class ConsoleAccess:
    """The console's decisions for ``security`` (None or no tokens: an open console)."""

    def __init__(self, security: GrpcSecurity | None):
        self.security = security
        self.open = security is None or not (security.accepted("read") or security.accepted("admin"))

    def caller(self, environ: dict, need: str = READ) -> Caller:
        """What the request in ``environ`` may do, for ``need`` (``READ`` or ``ACT``)."""
        name = _NAME.sub("", environ.get("HTTP_X_TWINFLOW_OPERATOR", ""))[:40].strip() or "anonymous"
        if need == ACT and not environ.get(ACTION_HEADER):
            return Caller(403, "an action needs the X-Twinflow-Console header (sent by the console's page)")
        if self.open:
            return Caller(200, may_act=True, who=f"{name} (open console)")
        auth = environ.get("HTTP_AUTHORIZATION", "")
        token = auth[7:].strip() if auth[:7].lower() == "bearer " else ""
        scopes = self.security.scopes_for(token) if token else frozenset()
        if "admin" in scopes:
            return Caller(200, may_act=True, who=f"{name} (token {token_fingerprint(token)})")
        if "read" in scopes:
            who = f"{name} (token {token_fingerprint(token)})"
            if need == ACT:
                return Caller(403, "this token may look but not act: resubmit and handover need an admin token",
                              who=who)
            return Caller(200, who=who)
        # No token, a wrong one, or one of another scope (ingest, escalation): one answer for all,
        # so that a refusal never tells a caller that its token is valid somewhere.
        return Caller(401, REFUSED, who=name)


def check_console_bind(address: str, security: GrpcSecurity | None, tls: bool) -> None:
    """Refuse (SecurityConfigError) to serve the console on a non-loopback ``address`` without TLS
    and tokens, unless ``security`` says insecure: anyone who reaches it could read messages and act."""
    if is_loopback(address) or (security is not None and security.insecure):
        return
    if not tls:
        raise SecurityConfigError(
            f"refusing to serve the console on {address} without TLS: tokens and failed messages would cross "
            f"the network in the clear; set a certificate and key (--tls-cert/--tls-key or the flow file's "
            f"security.tls), or bind 127.0.0.1")
    if ConsoleAccess(security).open:
        raise SecurityConfigError(
            f"refusing to serve the console on {address} without tokens: anyone who reaches it could resubmit "
            f"messages; set security.tokens (read and admin) or --token, or bind 127.0.0.1")
