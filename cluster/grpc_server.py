"""The gRPC server every peer runs, and its Ingest and Admin services.

``create_server`` binds one address, adds whichever servicers it is given
(Escalation, Ingest, Admin) and starts; the servicers stay thin over plain
callables, so the peer logic behind them is tested without gRPC.

Capacity: each service has its own share of the server's threads, so that one
service in trouble cannot starve the others. At most ``ingest_limit``
Publish calls, ``admin_limit`` Admin calls and ``escalation_streams``
Escalate streams run at once (defaults 8, 4 and 8); the thread pool holds
all of them plus :data:`REFUSAL_THREADS`, and gRPC refuses any call beyond
the pool's size, so an accepted call never waits for a thread. A call beyond
its service's limit is answered at once with ``RESOURCE_EXHAUSTED`` ("8
publishes in progress; retry") instead of queueing behind the calls that
hold the service's share: Publish calls hung on a down Redis leave the
escalation streams and Status untouched.

Under failure:

- A bind that fails (port taken, bad address) raises :class:`BindError` naming
  the address; nothing is left running. ``SO_REUSEPORT`` is off so that a
  second server can never silently share a port with the first.
- ``Publish`` refuses a wrong flow, an oversized batch, a resubmit
  envelope or a bad publisher name with ``INVALID_ARGUMENT`` before anything
  is written. It gives the uplink the
  RPC's remaining time less :data:`PUBLISH_ANSWER_MARGIN_S`, and at most
  ``max_wait_s`` (10 s by default, also when the client set no deadline), to
  answer: ``publish(bodies, deadline_s)`` retries while Redis is unreachable
  and raises ``RedisUnavailable`` once the deadline passes. Publish then
  answers ``UNAVAILABLE`` with the reason (also for a built-in
  ``ConnectionError`` from another uplink, or a store closed because the peer
  is stopping) before the client's own deadline, so a client knows it may
  retry. A publish that fails after writing some entries may have written
  them: Ingest is at-least-once.
- The server accepts keepalive pings every 0.5 s even on idle streams, which
  the escalation sender needs to notice a dead peer in 1-2 s; without this the
  server would answer its pings with GOAWAY ``too_many_pings``.

>>> from twinflow.client import peer_status, request_handover
>>> server, port = create_server("127.0.0.1:0", admin=AdminServicer(
...     status=lambda: {"flow": "orders", "role": "worker"},
...     handover=lambda timeout_s: {"ok": False, "reason": "not master"}))
>>> peer_status(f"127.0.0.1:{port}")["role"]
'worker'
>>> request_handover(f"127.0.0.1:{port}")["reason"]
'not master'
>>> _ = server.stop(None).wait()
"""

from __future__ import annotations

import threading
from concurrent import futures
from typing import Callable

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import HealthServicer
from grpc_reflection.v1alpha import reflection

from twinflow.cluster.escalation_servicer import EscalationServicer
from twinflow.cluster.failures_rpc import action_reply, failures_reply, notices_reply
from twinflow.cluster.flow_failures import FlowFailures
from twinflow.cluster.ingest_bodies import IngestRefused
from twinflow.grpc_keepalive import SERVER_OPTIONS
from twinflow.grpc_security import NO_SECURITY, GrpcSecurity, SecurityConfigError
from twinflow.runtime.store.store_errors import RedisUnavailable, StoreClosed
from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc


DEFAULT_INGEST_LIMIT = 8  # Publish calls at once
DEFAULT_ADMIN_LIMIT = 4  # Status and Handover calls at once
DEFAULT_ESCALATION_STREAMS = 8  # open Escalate streams (one per master escalating here; 8 is ample)
# Threads beyond the services' shares, for answering calls over a service's
# limit with RESOURCE_EXHAUSTED (each holds its thread for a moment).
REFUSAL_THREADS = 2

# The uplink is given the RPC's remaining time less this, so that its
# UNAVAILABLE reaches the client before the client's deadline.
PUBLISH_ANSWER_MARGIN_S = 0.25
# The most a Publish waits for the uplink, whatever (or whether) the client's deadline.
PUBLISH_MAX_WAIT_S = 10.0
# The largest request a peer takes (a Publish batch or an escalation batch); gRPC refuses more.
DEFAULT_MAX_MESSAGE_BYTES = 64 << 20


class BindError(RuntimeError):
    """The gRPC server could not listen on the address it was given."""


def create_server(
    address: str,
    *,
    escalation: EscalationServicer | None = None,
    ingest: IngestServicer | None = None,
    admin: AdminServicer | None = None,
    ingest_limit: int = DEFAULT_INGEST_LIMIT,
    admin_limit: int = DEFAULT_ADMIN_LIMIT,
    escalation_streams: int = DEFAULT_ESCALATION_STREAMS,
    security: GrpcSecurity = NO_SECURITY,
    health: HealthServicer | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
) -> tuple[grpc.Server, int]:
    """Start a server on ``address`` ("127.0.0.1:0" picks a free port); return it and its port.

    At most ``ingest_limit`` Publish calls, ``admin_limit`` Admin calls
    (Status and Handover together) and ``escalation_streams`` Escalate
    streams run at once; one more is answered at once with
    ``RESOURCE_EXHAUSTED``. Every open Escalate stream holds a thread for its
    whole life, so keep ``escalation_streams`` above the number of peers that
    escalate here (a refused stream's sender retries with back-off). The
    thread pool has ``ingest_limit + admin_limit + escalation_streams +
    REFUSAL_THREADS`` threads, and gRPC refuses (``RESOURCE_EXHAUSTED``) any
    call beyond that many, so no accepted call ever waits for a thread.

    ``security`` says whether the port has TLS and which bearer tokens each
    service needs (``twinflow.grpc_security``); a non-loopback ``address``
    without them is refused (``SecurityConfigError``) unless it says
    ``insecure``. ``health`` (the standard health service, whose statuses the
    caller sets) and server reflection are served without a token. A request
    over ``max_message_bytes`` is refused by gRPC with ``RESOURCE_EXHAUSTED``.
    """
    security.check_bind(address)
    for name, value in (("ingest_limit", ingest_limit), ("admin_limit", admin_limit),
                        ("escalation_streams", escalation_streams)):
        if value < 1:
            raise ValueError(f"{name} must be at least 1, got {value}")
    limits = _ServiceLimits({
        _service("Ingest"): _Limit(ingest_limit, f"{ingest_limit} publishes in progress; retry"),
        _service("Admin"): _Limit(admin_limit, f"{admin_limit} admin calls in progress; retry"),
        _service("Escalation"): _Limit(escalation_streams, f"{escalation_streams} escalation streams open; retry"),
    })
    workers = ingest_limit + admin_limit + escalation_streams + REFUSAL_THREADS
    # The token check comes first, so that a refused call never takes a slot of its service.
    token_check = security.server_interceptor()
    interceptors = [i for i in (token_check, limits) if i is not None]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="grpc-server"),
        interceptors=interceptors,
        options=SERVER_OPTIONS + [("grpc.max_receive_message_length", max_message_bytes)],
        maximum_concurrent_rpcs=workers,
    )
    if escalation is not None:
        pb_grpc.add_EscalationServicer_to_server(escalation, server)
    if ingest is not None:
        pb_grpc.add_IngestServicer_to_server(ingest, server)
    if admin is not None:
        pb_grpc.add_AdminServicer_to_server(admin, server)
    if health is not None:
        health_pb2_grpc.add_HealthServicer_to_server(health, server)
    served = [pb.DESCRIPTOR.services_by_name[n].full_name for n, s in
              (("Escalation", escalation), ("Ingest", ingest), ("Admin", admin)) if s is not None]
    reflection.enable_server_reflection(
        served + ([health_pb2.DESCRIPTOR.services_by_name["Health"].full_name] if health is not None else [])
        + [reflection.SERVICE_NAME], server)
    try:
        port = security.add_port(server, address)
    except SecurityConfigError:  # a TLS file that cannot be read: nothing may be left half built
        server.stop(None)
        raise
    except RuntimeError as exc:  # grpcio raises here when the bind fails
        raise BindError(f"cannot listen on {address}: {exc}") from exc
    server.start()
    server.token_check = token_check  # its refusal counts, for the peer's metrics (None: no tokens)
    return server, port


def _service(name: str) -> str:
    return pb.DESCRIPTOR.services_by_name[name].full_name


class _Limit:
    """A service's share: a non-blocking semaphore and the refusal for a call beyond it."""

    def __init__(self, limit: int, refusal: str):
        self._slots = threading.BoundedSemaphore(limit)
        self.refusal = refusal

    def wrap(self, handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
        if handler.unary_unary is not None:
            return handler._replace(unary_unary=self._unary(handler.unary_unary))
        if handler.stream_unary is not None:
            return handler._replace(stream_unary=self._unary(handler.stream_unary))
        if handler.unary_stream is not None:
            return handler._replace(unary_stream=self._streaming(handler.unary_stream))
        return handler._replace(stream_stream=self._streaming(handler.stream_stream))

    def _unary(self, behavior):
        def limited(request, context):
            if not self._slots.acquire(blocking=False):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.refusal)
            try:
                return behavior(request, context)
            finally:
                self._slots.release()

        return limited

    def _streaming(self, behavior):
        # A generator: the slot is taken when gRPC starts the response stream
        # and given back when the stream ends, however it ends.
        def limited(request, context):
            if not self._slots.acquire(blocking=False):
                context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, self.refusal)
            try:
                yield from behavior(request, context)
            finally:
                self._slots.release()

        return limited


class _ServiceLimits(grpc.ServerInterceptor):
    """Puts every method of a limited service behind that service's :class:`_Limit`."""

    def __init__(self, limits: dict[str, _Limit]):
        self._limits = limits

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        service = handler_call_details.method.lstrip("/").split("/", 1)[0]
        limit = self._limits.get(service)
        return handler if handler is None or limit is None else limit.wrap(handler)


class IngestServicer(pb_grpc.IngestServicer):
    """Writes published message bodies into the flow's uplink through ``publish(bodies, deadline_s)``,
    and serves the publishers' error notices from ``failures()`` (``failures_rpc.py``).

    ``publish`` must return the bodies' uplink positions within about
    ``deadline_s`` seconds or raise ``RedisUnavailable`` (or ``ConnectionError``)
    with the reason; ``FlowStore.publish`` does. ``deadline_s`` is the RPC's
    remaining time less :data:`PUBLISH_ANSWER_MARGIN_S`, at most ``max_wait_s``.
    A request that names its publisher calls ``publish(bodies, deadline_s, publisher=...)``;
    ``IngestRefused`` from it is answered ``INVALID_ARGUMENT`` (nothing was written).
    Without ``failures``, Notices is answered ``UNIMPLEMENTED``.
    """

    def __init__(
        self,
        flow: str,
        publish: Callable[..., list[str]],
        max_batch: int = 10_000,
        max_wait_s: float = PUBLISH_MAX_WAIT_S,
        failures: Callable[[], FlowFailures] | None = None,
    ):
        self.flow, self._publish, self.max_batch, self.max_wait_s = flow, publish, max_batch, max_wait_s
        self._failures = failures

    def Publish(self, request, context):
        if request.flow != self.flow:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"wrong flow {request.flow!r}: this peer serves {self.flow!r}"
            )
        if len(request.messages) > self.max_batch:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(request.messages)} messages in one request; at most {self.max_batch}",
            )
        if not request.messages:
            return pb.PublishReply()
        bodies = [m.body for m in request.messages]
        try:
            if request.publisher:
                positions = self._publish(bodies, self._deadline_s(context), publisher=request.publisher)
            else:
                positions = self._publish(bodies, self._deadline_s(context))
        except IngestRefused as exc:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"publish to flow {self.flow!r} refused: {exc}")
        except (RedisUnavailable, ConnectionError) as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"uplink of flow {self.flow!r} unavailable: {exc}")
        except StoreClosed:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"uplink of flow {self.flow!r} closed: the peer is stopping")
        return pb.PublishReply(positions=positions)

    def Notices(self, request, context):
        if self._failures is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server keeps no notices")
        return notices_reply(self._failures(), request, context)

    def _deadline_s(self, context) -> float:
        # Without a client deadline gRPC reports a remaining time of centuries (or None).
        remaining = context.time_remaining()
        if remaining is None:
            return self.max_wait_s
        return max(0.0, min(remaining - PUBLISH_ANSWER_MARGIN_S, self.max_wait_s))


class AdminServicer(pb_grpc.AdminServicer):
    """Answers Status from ``status()`` and Handover through ``handover(timeout_s)``; Resume through
    ``resume(by)`` (the suspensions it asked to end); Failures, Resubmit and Discard over the
    audit ``failures()`` gives (``failures_rpc.py``).

    Both callables return plain dicts keyed by the reply's field names; a
    missing or ``None`` key leaves the field at its default and a key the
    reply does not have is ignored. Without ``failures``, the audit's calls are
    answered ``UNIMPLEMENTED``.
    """

    DEFAULT_HANDOVER_TIMEOUT_S = 5.0

    def __init__(self, status: Callable[[], dict], handover: Callable[[float], dict],
                 failures: Callable[[], FlowFailures] | None = None,
                 resume: Callable[[str], list[dict]] | None = None):
        self._status, self._handover, self._failures = status, handover, failures
        self._resume = resume

    def Status(self, request, context):
        return _from_dict(pb.NodeStatus, self._status())

    def Handover(self, request, context):
        return _from_dict(pb.HandoverReply, self._handover(request.timeout_s or self.DEFAULT_HANDOVER_TIMEOUT_S))

    def Resume(self, request, context):
        if self._resume is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server runs no flow to resume")
        resumed = self._resume(request.by or context.peer())
        return pb.ResumeReply(resumed=[_from_dict(pb.Suspension, s) for s in resumed])

    def Failures(self, request, context):
        return failures_reply(self._audit(context), request, context)

    def Resubmit(self, request, context):
        return action_reply(self._audit(context), request, context, resubmit=True)

    def Discard(self, request, context):
        return action_reply(self._audit(context), request, context, resubmit=False)

    def _audit(self, context) -> FlowFailures:
        if self._failures is None:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "this server keeps no audit")
        return self._failures()


def _from_dict(message_type, values: dict):
    fields = message_type.DESCRIPTOR.fields_by_name
    return message_type(**{k: v for k, v in values.items() if k in fields and v is not None})
