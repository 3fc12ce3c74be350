"""Who may call a peer over gRPC: TLS on the wire and a bearer token per scope.

Every peer serves three services, each with its own *scope* and token:
``ingest`` (Publish and a publisher's Notices), ``escalation`` (the master's
claims to a worker) and ``admin`` (Status, Handover, Resume and the audit's
Failures, Resubmit and Discard). A fourth scope, ``read``, has no service of
its own: the methods that only read what an operator may look at (Admin's
Status and Failures, :func:`scopes_of`) take a ``read`` token as well as
their service's, and nothing else does, so a read token lets an operator or
a console look without acting. A call carries its token as
``authorization: Bearer <token>`` metadata; :class:`TokenCheck`, a server
interceptor, checks it before the call takes any of its service's threads.
The standard health and reflection services stay open (a load balancer
probes health without a token; reflection tells only the schema, which the
proto file in this repository tells anyway).

:class:`GrpcSecurity` holds what a peer or a client needs: the TLS files
(a server certificate and key; the CA that signed the peers'; ``mutual``
for client certificates between peers) and the tokens, read from secret
references (``file:PATH`` or ``env:NAME``, :mod:`twinflow.secrets`) so that
no token is ever on a command line. A caller sends, for each method, the
token of the least of the method's scopes it holds
(:meth:`GrpcSecurity.scope_to_send`: read before admin).

Rotation: a token reference may hold several tokens, one a line. A server
accepts any of them for that scope; a caller sends the first. So old and new
are both accepted while every peer and client moves to the new one, and the
old one is refused once its line is gone (docs/operations/deploy.md, "Rotating
certificates and tokens"). Likewise a CA file may hold several CA certificates
(old and new concatenated): a certificate signed by any of them is trusted.
The tokens are read when a :class:`GrpcSecurity` is made (a peer's start, an
operator command's run), the TLS files when a server or channel is (a peer's
start, and its escalation stream's reconnects): a peer's server checks calls
against a changed file from its next start, not before.

Under failure:

- A token that is missing or wrong is refused with ``UNAUTHENTICATED``; a
  valid token of a scope the method does not take (an ingest client calling
  Handover, a read token calling Resubmit) with ``PERMISSION_DENIED``.
  Tokens are compared in constant time and never logged
  (:func:`token_fingerprint` names one safely). Each refusal is counted
  (:attr:`TokenCheck.refused`), and so is each call accepted with a token
  other than the first of its scope (:attr:`TokenCheck.accepted_not_first`:
  a caller still sending the token being rotated out).
- :meth:`GrpcSecurity.check_bind` refuses to serve a non-loopback address
  unless TLS and the ingest, escalation and admin tokens are set
  (:data:`REQUIRED_SCOPES`; a read token is optional, so a deployment made
  before it still starts), or the operator said ``insecure`` (then
  :func:`warn_insecure` logs a warning at start and every minute). Loopback
  stays open by default: only this machine reaches it.
- A TLS file that cannot be read raises :class:`SecurityConfigError`
  naming the file; nothing starts.

>>> sec = GrpcSecurity(tokens={"ingest": "i-tok", "escalation": "e-tok", "admin": "a-tok"})
>>> sec.check_bind("127.0.0.1:0")
>>> sec.check_bind("0.0.0.0:7070")
Traceback (most recent call last):
...
twinflow.grpc_security.SecurityConfigError: refusing to serve gRPC on 0.0.0.0:7070 without TLS: \
anyone who reaches the port could read and forge escalations; set a certificate and key \
(flow file security.tls or --tls-cert/--tls-key), or pass --insecure
>>> rotating = GrpcSecurity(tokens={"admin": "new"}, accepted_tokens={"admin": ("new", "old")})
>>> rotating.accepted("admin"), rotating.accepted("ingest")
(('new', 'old'), ())
>>> scopes_of("/twinflow.wire.Admin/Status"), scopes_of("/twinflow.wire.Admin/Handover")
(('read', 'admin'), ('admin',))
>>> looker = GrpcSecurity(tokens={"read": "r-tok", "admin": "a-tok"})
>>> looker.scope_to_send("/twinflow.wire.Admin/Failures"), looker.scope_to_send("/twinflow.wire.Admin/Resubmit")
('read', 'admin')
>>> sorted(looker.scopes_for("r-tok")), sorted(looker.scopes_for("guess"))
(['read'], [])
>>> token_fingerprint("r-tok")
'sha256:7654ec11'
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

import grpc

from .secrets import read_tokens

log = logging.getLogger("twinflow.security")

SCOPES = ("ingest", "escalation", "admin", "read")
# What a peer serving off loopback must have a token for. Not read: a secured deployment made
# before the read scope has no read token, and its Status and Failures take the admin token.
REQUIRED_SCOPES = ("ingest", "escalation", "admin")
# Each service's own scope: every method of the service takes it, a method added later too.
_SERVICE_SCOPES = {
    "twinflow.wire.Ingest": "ingest",
    "twinflow.wire.Escalation": "escalation",
    "twinflow.wire.Admin": "admin",
}
# The methods that change nothing and tell only what an operator may look at: they take a read
# token besides their service's. Ingest's Notices is not one: it is a publisher's feed, read with
# its cursor and the ingest token, and an operator finds the same failures (more of each) in
# Failures; so the read and admin scopes stay out of the Ingest service altogether.
READ_METHODS = frozenset({
    "/twinflow.wire.Admin/Status",
    "/twinflow.wire.Admin/Failures",
})
# Served without a token (see the module doc).
OPEN_SERVICES = frozenset({
    "grpc.health.v1.Health",
    "grpc.reflection.v1alpha.ServerReflection",
    "grpc.reflection.v1.ServerReflection",
})
INSECURE_WARNING_EVERY_S = 60.0


class SecurityConfigError(ValueError):
    """The gRPC security settings cannot be used; the message names the file or setting."""


def scope_of(method: str) -> str | None:
    """The scope of a full method name's ("/package.Service/Method") service, which each of the
    service's methods takes, or None for an open service (:func:`scopes_of` gives them all)."""
    return _SERVICE_SCOPES.get(method.lstrip("/").split("/", 1)[0])


def scopes_of(method: str) -> tuple[str, ...]:
    """Every scope whose token may call ``method`` ("/package.Service/Method"), the least first:
    ``read`` and the service's own for one of :data:`READ_METHODS`, else the service's own alone;
    none for an open service."""
    scope = scope_of(method)
    if scope is None:
        return ()
    return ("read", scope) if "/" + method.lstrip("/") in READ_METHODS else (scope,)


def token_fingerprint(token: str) -> str:
    """A short name of ``token`` that is safe to log: ``sha256:`` and the first 8 hex digits of its
    SHA-256. The same token always gives the same name, so a log line can say which token did
    something (``printf %s TOKEN | sha256sum`` finds it) without the token. A random token (32 bytes,
    as the guides make them) cannot be found from its name; a guessable one could be checked
    against it, as against any hash, so tokens are never words."""
    return "sha256:" + hashlib.sha256(token.encode()).hexdigest()[:8]


@dataclass(frozen=True)
class TlsFiles:
    """PEM files: this side's certificate and key, and the CA that signed the other side's."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    mutual: bool = False          # servers ask for, and check, client certificates (peer to peer)
    server_name: str | None = None  # the name a client checks in the server's certificate, if not the host

    def server_credentials(self) -> grpc.ServerCredentials:
        if not (self.cert and self.key):
            raise SecurityConfigError("TLS needs both a certificate and its key (tls.cert, tls.key)")
        if self.mutual and not self.ca:
            raise SecurityConfigError("mutual TLS needs the CA that signs the clients' certificates (tls.ca)")
        return grpc.ssl_server_credentials(
            [(_read(self.key, "tls.key"), _read(self.cert, "tls.cert"))],
            root_certificates=_read(self.ca, "tls.ca") if self.ca else None,
            require_client_auth=self.mutual,
        )

    def channel_credentials(self) -> grpc.ChannelCredentials:
        # Without a CA file the system's roots verify the server (a public CA).
        # The client certificate goes along when there is one (mutual TLS between peers).
        pair = (_read(self.key, "tls.key"), _read(self.cert, "tls.cert")) if self.cert and self.key else (None, None)
        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca, "tls.ca") if self.ca else None,
            private_key=pair[0], certificate_chain=pair[1])


def _read(path: str, what: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise SecurityConfigError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None


@dataclass(frozen=True)
class GrpcSecurity:
    """TLS files and per-scope tokens for a peer (serving and escalating) or a client."""

    tls: TlsFiles | None = None
    tokens: Mapping[str, str] = field(default_factory=dict)  # scope -> the token this side sends
    insecure: bool = False        # the operator allowed a non-loopback bind without TLS and tokens
    # scope -> every token a server accepts, the one sent first (a rotation's overlap); a scope
    # not here accepts its token alone.
    accepted_tokens: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self):
        for scope, accepted in self.accepted_tokens.items():
            # The first is what this side sends, so the one a caller that has switched sends too.
            if not accepted or accepted[0] != self.tokens.get(scope):
                raise SecurityConfigError(f"the tokens accepted for {scope} must start with the one sent")

    @classmethod
    def from_refs(cls, tls: TlsFiles | None = None, token_refs: Mapping[str, str] | None = None,
                  insecure: bool = False) -> "GrpcSecurity":
        """Read each scope's tokens from its secret reference (``file:PATH`` or ``env:NAME``, one
        token a line): the first is sent, every one accepted."""
        tokens, accepted = {}, {}
        for scope, ref in (token_refs or {}).items():
            if scope not in SCOPES:
                raise SecurityConfigError(f"unknown token scope {scope!r}; the scopes are {', '.join(SCOPES)}")
            accepted[scope] = read_tokens(ref)
            tokens[scope] = accepted[scope][0]
        return cls(tls=tls, tokens=tokens, insecure=insecure, accepted_tokens=accepted)

    @property
    def uses_tokens(self) -> bool:
        return bool(self.tokens)

    def accepted(self, scope: str) -> tuple[str, ...]:
        """The tokens a server takes for ``scope``, the one sent first; none for a scope without one."""
        if scope not in self.tokens:
            return ()
        return self.accepted_tokens.get(scope) or (self.tokens[scope],)

    def scope_to_send(self, method: str) -> str:
        """The scope whose token this side sends to call ``method``: the least of the method's scopes
        it holds a token for (read before admin: the least that suffices), else the service's own
        (then no token goes, and the peer answers ``UNAUTHENTICATED`` naming the scope it needs)."""
        scopes = scopes_of(method)
        if not scopes:
            raise ValueError(f"{method} is served without a token")
        return next((scope for scope in scopes if scope in self.tokens), scopes[-1])

    def scopes_for(self, token: str) -> frozenset[str]:
        """Every scope whose accepted tokens include ``token`` (none: not a token of this side's).
        Each accepted token of every scope is compared, in constant time, and none skipped, so the
        time taken does not tell which matched; for a caller that checks tokens itself (an
        operator console over HTTP) with the peers' token files."""
        presented = token.encode()
        return frozenset(scope for scope in self.tokens
                         if _rank(presented, tuple(t.encode() for t in self.accepted(scope))) is not None)

    def check_bind(self, address: str) -> None:
        """Raise :class:`SecurityConfigError` when serving ``address`` like this is not allowed."""
        if is_loopback(address) or self.insecure:
            return
        if self.tls is None or not (self.tls.cert and self.tls.key):
            raise SecurityConfigError(
                f"refusing to serve gRPC on {address} without TLS: anyone who reaches the port could read "
                f"and forge escalations; set a certificate and key (flow file security.tls or "
                f"--tls-cert/--tls-key), or pass --insecure")
        missing = [s for s in REQUIRED_SCOPES if s not in self.tokens]
        if missing:
            raise SecurityConfigError(
                f"refusing to serve gRPC on {address} without a token for {', '.join(missing)}: anyone who "
                f"reaches the port could call those services; set security.tokens in the flow file "
                f"(or --token SCOPE=file:PATH), or pass --insecure")

    def warn_if_insecure(self, address: str, stop: threading.Event) -> None:
        """With ``insecure`` on a non-loopback ``address``: :func:`warn_insecure` until ``stop``."""
        if self.insecure and not is_loopback(address):
            warn_insecure(address, stop)

    def server_interceptor(self) -> "TokenCheck | None":
        return TokenCheck({scope: self.accepted(scope) for scope in self.tokens}) if self.tokens else None

    def add_port(self, server: grpc.Server, address: str) -> int:
        """Bind ``address`` on ``server``, with TLS when this has a certificate."""
        if self.tls is not None and self.tls.cert:
            return server.add_secure_port(address, self.tls.server_credentials())
        return server.add_insecure_port(address)

    def channel(self, address: str, scope: str, options: list | None = None) -> grpc.Channel:
        """A channel to ``address`` that sends this side's token for ``scope`` with every call."""
        options = list(options or [])
        if self.tls is not None:
            if self.tls.server_name:
                options.append(("grpc.ssl_target_name_override", self.tls.server_name))
            channel = grpc.secure_channel(address, self.tls.channel_credentials(), options=options)
        else:
            channel = grpc.insecure_channel(address, options=options)
        token = self.tokens.get(scope)
        return grpc.intercept_channel(channel, _BearerToken(token)) if token else channel


NO_SECURITY = GrpcSecurity()


def security_from(spec, *, cert: str | None = None, key: str | None = None, ca: str | None = None,
                  mutual: bool = False, server_name: str | None = None,
                  token_refs: Mapping[str, str] | None = None, insecure: bool = False,
                  scopes: tuple[str, ...] | None = None) -> GrpcSecurity:
    """The flow file's ``security`` section (a ``SecuritySpec``, or None) with the command line's
    settings over it, the tokens read now: every scope's, or with ``scopes`` (a client that calls
    only those services) those scopes' alone. TLS is on when there is a certificate or a CA."""
    cert = cert or (spec.tls_cert if spec else None)
    key = key or (spec.tls_key if spec else None)
    ca = ca or (spec.tls_ca if spec else None)
    if (cert is None) != (key is None):
        raise SecurityConfigError("a TLS certificate needs its key, and a key its certificate")
    tls = None
    if cert or ca:
        tls = TlsFiles(cert=cert, key=key, ca=ca, mutual=mutual or bool(spec and spec.tls_mutual),
                       server_name=server_name or (spec.tls_server_name if spec else None))
        if tls.mutual and not ca:
            raise SecurityConfigError("mutual TLS needs the CA that signs the clients' certificates (tls.ca)")
    refs = dict(spec.tokens) if spec else {}
    refs.update(token_refs or {})
    if scopes is not None:  # an unknown scope is still refused
        refs = {scope: ref for scope, ref in refs.items() if scope in scopes or scope not in SCOPES}
    return GrpcSecurity.from_refs(tls, refs, insecure=insecure)


def is_loopback(address: str) -> bool:
    """True for a bind or dial address on this host only (127.0.0.0/8, ::1, localhost, unix:)."""
    if address.startswith("unix:"):
        return True
    host = address.rsplit(":", 1)[0] if ":" in address else address
    return loopback_host(host.strip("[]"))


def loopback_host(host: str) -> bool:
    """A host name or address that reaches only this machine (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def warn_insecure(address: str, stop: threading.Event, every_s: float = INSECURE_WARNING_EVERY_S,
                  wait: Callable[[float], bool] | None = None) -> threading.Thread:
    """Log that ``address`` is served without TLS and tokens now and every ``every_s`` until ``stop``."""
    wait = wait or stop.wait

    def loop() -> None:
        while True:
            log.warning("--insecure: gRPC on %s is served without TLS or tokens; anyone who reaches it can "
                        "publish, hand over and forge escalations", address)
            if wait(every_s):
                return

    thread = threading.Thread(target=loop, name="insecure-warning", daemon=True)
    thread.start()
    return thread


class TokenCheck(grpc.ServerInterceptor):
    """Refuses a call whose bearer token is not one of a scope its method takes (see module doc).

    ``tokens`` maps a scope to its token, or to its tokens during a rotation (the first is the
    one callers that have switched send; a call with another one is counted in
    :attr:`accepted_not_first`, under the scope that took it)."""

    def __init__(self, tokens: Mapping[str, str | Sequence[str]]):
        self._tokens = {scope: tuple(t.encode() for t in ((value,) if isinstance(value, str) else value))
                        for scope, value in tokens.items()}
        self._lock = threading.Lock()
        self.refused = {"unauthenticated": 0, "permission_denied": 0}
        self.accepted_not_first = {scope: 0 for scope in self._tokens}

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        method = handler_call_details.method
        scopes = scopes_of(method)
        if handler is None or not scopes:
            return handler
        presented = _bearer(handler_call_details.invocation_metadata)
        # Every scope's tokens are compared, not only the method's: whether the token is known at
        # all decides between the two refusals, and the time taken must not tell which matched.
        ranks = ({scope: _rank(presented, tokens) for scope, tokens in self._tokens.items()}
                 if presented is not None else {})
        taken = [(ranks[scope], scope) for scope in scopes if ranks.get(scope) is not None]
        if taken:
            rank, scope = min(taken)  # the first of a scope's tokens, if any scope has it first
            if rank:
                with self._lock:
                    self.accepted_not_first[scope] += 1
            return handler
        # Name the scopes this server has tokens for: a peer without a read token takes Status
        # with the admin token alone, and the refusal should say so.
        needed = " or ".join(s for s in scopes if s in self._tokens) or " or ".join(scopes)
        if any(rank is not None for rank in ranks.values()):
            return self._refuse(handler, "permission_denied", grpc.StatusCode.PERMISSION_DENIED,
                                f"this token may not call {method.lstrip('/')} (it takes the {needed} token)")
        why = "no bearer token" if presented is None else "the bearer token is not valid"
        return self._refuse(handler, "unauthenticated", grpc.StatusCode.UNAUTHENTICATED,
                            f"{why} for {needed} (send 'authorization: Bearer <token>')")

    def _refuse(self, handler, kind: str, code: grpc.StatusCode, reason: str):
        with self._lock:
            self.refused[kind] += 1

        def abort(request, context):
            context.abort(code, reason)

        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(abort)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(abort)
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(abort)
        return grpc.stream_stream_rpc_method_handler(abort)


def _rank(presented: bytes, tokens: tuple[bytes, ...]) -> int | None:
    """The index of the first of ``tokens`` that ``presented`` is, or None. Each is compared in
    constant time and none is skipped, so the time taken does not tell which one matched."""
    found = None
    for i, token in enumerate(tokens):
        if hmac.compare_digest(presented, token) and found is None:
            found = i
    return found


def _bearer(metadata) -> bytes | None:
    for key, value in metadata or ():
        if key == "authorization":
            text = value.decode() if isinstance(value, bytes) else value
            if text.startswith("Bearer "):
                return text[len("Bearer "):].encode()
    return None


class _BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                   grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds ``authorization: Bearer <token>`` to every call of a channel (TLS or not)."""

    def __init__(self, token: str):
        self._header = ("authorization", f"Bearer {token}")

    def _with_token(self, details):
        metadata = list(details.metadata or ()) + [self._header]
        return _CallDetails(details.method, details.timeout, metadata, details.credentials,
                            getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._with_token(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._with_token(details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(self, method, timeout, metadata, credentials, wait_for_ready, compression):
        self.method, self.timeout, self.metadata = method, timeout, metadata
        self.credentials, self.wait_for_ready, self.compression = credentials, wait_for_ready, compression
