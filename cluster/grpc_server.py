"""The gRPC server every node runs, its Ingest and Admin services, and small clients.

``create_server`` binds one address, adds whichever servicers it is given
(Escalation, Ingest, Admin) and starts; the servicers stay thin over plain
callables, so the node logic behind them is tested without gRPC.

Under failure:

- A bind that fails (port taken, bad address) raises :class:`BindError` naming
  the address; nothing is left running. ``SO_REUSEPORT`` is off so that a
  second server can never silently share a port with the first.
- ``Publish`` refuses a wrong flow or an oversized batch with
  ``INVALID_ARGUMENT`` before anything is written, and answers ``UNAVAILABLE``
  (with the reason) when the uplink's server is down (``publish`` raised
  ``ConnectionError``), so a client knows it may retry. A publish that fails
  after writing some entries may have written them: Ingest is at-least-once.
- The server accepts keepalive pings every 0.5 s even on idle streams, which
  the escalation sender needs to notice a dead peer in 1-2 s; without this the
  server would answer its pings with GOAWAY ``too_many_pings``.

>>> server, port = create_server("127.0.0.1:0", admin=AdminServicer(
...     status=lambda: {"flow": "orders", "role": "worker"},
...     handover=lambda timeout_s: {"ok": False, "reason": "not master"}))
>>> node_status(f"127.0.0.1:{port}")["role"]
'worker'
>>> request_handover(f"127.0.0.1:{port}")["reason"]
'not master'
>>> _ = server.stop(None).wait()
"""

from __future__ import annotations

from concurrent import futures
from typing import Callable

import grpc

from twinflow.cluster.escalation import EscalationServicer
from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc

SERVER_OPTIONS = [
    ("grpc.so_reuseport", 0),
    # Let clients ping often (escalation keepalive is 1 s) and never strike them for it.
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.http2.max_ping_strikes", 0),
]


class BindError(RuntimeError):
    """The gRPC server could not listen on the address it was given."""


def create_server(
    address: str,
    *,
    escalation: EscalationServicer | None = None,
    ingest: IngestServicer | None = None,
    admin: AdminServicer | None = None,
    max_workers: int = 8,
) -> tuple[grpc.Server, int]:
    """Start a server on ``address`` ("127.0.0.1:0" picks a free port); return it and its port.

    Every open Escalate stream holds one of the ``max_workers`` threads for
    its whole life, so size it above the number of peers that escalate here.
    """
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers), options=SERVER_OPTIONS)
    if escalation is not None:
        pb_grpc.add_EscalationServicer_to_server(escalation, server)
    if ingest is not None:
        pb_grpc.add_IngestServicer_to_server(ingest, server)
    if admin is not None:
        pb_grpc.add_AdminServicer_to_server(admin, server)
    try:
        port = server.add_insecure_port(address)
    except RuntimeError as exc:  # grpcio raises here when the bind fails
        raise BindError(f"cannot listen on {address}: {exc}") from exc
    if not port:  # older grpcio returned 0 instead of raising
        raise BindError(f"cannot listen on {address}")
    server.start()
    return server, port


class IngestServicer(pb_grpc.IngestServicer):
    """Writes published message bodies into the flow's uplink through ``publish``."""

    def __init__(self, flow: str, publish: Callable[[list[bytes]], list[str]], max_batch: int = 10_000):
        self.flow, self._publish, self.max_batch = flow, publish, max_batch

    def Publish(self, request, context):
        if request.flow != self.flow:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"wrong flow {request.flow!r}: this node serves {self.flow!r}"
            )
        if len(request.messages) > self.max_batch:
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"{len(request.messages)} messages in one request; at most {self.max_batch}",
            )
        if not request.messages:
            return pb.PublishReply()
        try:
            positions = self._publish([m.body for m in request.messages])
        except ConnectionError as exc:
            context.abort(grpc.StatusCode.UNAVAILABLE, f"uplink unavailable: {exc}")
        return pb.PublishReply(positions=positions)


class AdminServicer(pb_grpc.AdminServicer):
    """Answers Status from ``status()`` and Handover through ``handover(timeout_s)``.

    Both callables return plain dicts keyed by the reply's field names; a
    missing or ``None`` key leaves the field at its default and a key the
    reply does not have is ignored.
    """

    DEFAULT_HANDOVER_TIMEOUT_S = 5.0

    def __init__(self, status: Callable[[], dict], handover: Callable[[float], dict]):
        self._status, self._handover = status, handover

    def Status(self, request, context):
        return _from_dict(pb.NodeStatus, self._status())

    def Handover(self, request, context):
        return _from_dict(pb.HandoverReply, self._handover(request.timeout_s or self.DEFAULT_HANDOVER_TIMEOUT_S))


def _from_dict(message_type, values: dict):
    fields = message_type.DESCRIPTOR.fields_by_name
    return message_type(**{k: v for k, v in values.items() if k in fields and v is not None})


def _to_dict(message) -> dict:
    return {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}


def publish(address: str, flow: str, bodies: list[bytes], timeout_s: float = 10.0) -> list[str]:
    """Publish ``bodies`` to ``flow`` through the node at ``address``; return their uplink positions.

    Raises ``grpc.RpcError``; its ``code()`` is ``UNAVAILABLE`` when the node or
    its uplink is down (safe to retry, at the risk of a duplicate entry).
    """
    request = pb.PublishRequest(flow=flow, messages=[pb.Envelope(body=b) for b in bodies])
    with grpc.insecure_channel(address) as channel:
        return list(pb_grpc.IngestStub(channel).Publish(request, timeout=timeout_s).positions)


def node_status(address: str, timeout_s: float = 5.0) -> dict:
    """The NodeStatus of the node at ``address`` as a dict with every field."""
    with grpc.insecure_channel(address) as channel:
        return _to_dict(pb_grpc.AdminStub(channel).Status(pb.StatusRequest(), timeout=timeout_s))


def request_handover(address: str, timeout_s: float = 5.0) -> dict:
    """Ask the node at ``address`` to hand mastership over within ``timeout_s``; the reply as a dict."""
    # The node may use all of timeout_s before it answers; the RPC deadline leaves room for the reply.
    with grpc.insecure_channel(address) as channel:
        reply = pb_grpc.AdminStub(channel).Handover(pb.HandoverRequest(timeout_s=timeout_s), timeout=timeout_s + 5.0)
        return _to_dict(reply)
