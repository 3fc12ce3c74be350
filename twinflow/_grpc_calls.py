"""Single gRPC calls to a peer, without retries: a Publish, a Status, a Handover, the audit's
Failures, Resubmit and Discard, a publisher's Notices, and the encoding and batching of the
bodies a publish sends.

It holds the calls :class:`twinflow.client.Client` makes, and the one-call functions
``publish``, ``peer_status`` (``node_status``, deprecated) and ``request_handover`` that
``twinflow.client`` exposes. Under failure each call raises the peer's ``grpc.RpcError`` as it comes and retries nothing: the
retrying, the back-off and what a publish that gave up wrote are :class:`twinflow.client.Client`'s
(``twinflow.client``).
"""

from __future__ import annotations

import json
import warnings
from typing import Iterable, Mapping

import grpc

from twinflow.grpc_security import NO_SECURITY, GrpcSecurity
from twinflow.wire import twinflow_pb2 as pb
from twinflow.wire import twinflow_pb2_grpc as pb_grpc

# The peer may use all of the handover's timeout_s before it answers; the RPC leaves room for the reply.
HANDOVER_REPLY_MARGIN_S = 5.0
# The calls that only read: a caller sends the read token for them when it has one
# (GrpcSecurity.scope_to_send), the admin token otherwise.
STATUS = "/twinflow.wire.Admin/Status"
FAILURES = "/twinflow.wire.Admin/Failures"


# ---- single calls, shared by the client and the compatibility functions -------


def _encode(body: bytes | dict, index: int) -> bytes:
    if isinstance(body, (bytes, bytearray, memoryview)):
        return bytes(body)
    if isinstance(body, Mapping):
        return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
    raise TypeError(f"body {index} is a {type(body).__name__}; give bytes (a JSON document) or a dict")


def _batches(bodies: list[bytes], batch_size: int, max_bytes: int) -> Iterable[list[bytes]]:
    batch: list[bytes] = []
    size = 0
    for body in bodies:
        if batch and (len(batch) == batch_size or size + len(body) > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(body)
        size += len(body)
    if batch:
        yield batch


def _publish_once(channel: grpc.Channel, flow: str, bodies: list[bytes], timeout_s: float,
                  publisher: str = "") -> list[str]:
    request = pb.PublishRequest(flow=flow, messages=[pb.Envelope(body=b) for b in bodies], publisher=publisher)
    return list(pb_grpc.IngestStub(channel).Publish(request, timeout=timeout_s).positions)


def _notices(channel: grpc.Channel, flow: str, publisher: str, after: str, max_count: int,
             timeout_s: float) -> tuple[list[dict], str]:
    request = pb.NoticesRequest(flow=flow, publisher=publisher, after=after, max=max_count)
    reply = pb_grpc.IngestStub(channel).Notices(request, timeout=timeout_s)
    return [_to_dict(n) for n in reply.notices], reply.cursor


def _failures_request(flow: str, node: str | None = None, reason: str | None = None, since: float | None = None,
                      until: float | None = None, status: str = "FAILED", limit: int = 100,
                      after: str | None = None, audit_id: str = "") -> pb.FailuresRequest:
    return pb.FailuresRequest(flow=flow, node=node or "", reason=reason or "", since=since or 0.0,
                              until=until or 0.0, status=status, limit=limit, after=after or "",
                              audit_id=audit_id)


def _failures(channel: grpc.Channel, request: pb.FailuresRequest, timeout_s: float) -> list[dict]:
    reply = pb_grpc.AdminStub(channel).Failures(request, timeout=timeout_s)
    return [_audit_entry(e) for e in reply.entries]


def _audit_entry(entry) -> dict:
    out = _to_dict(entry)
    out["message"] = entry.message.decode("utf-8", "replace")
    out["mark"] = json.loads(out.pop("mark_json")) if entry.mark_json else None
    out["outcome"] = json.loads(out.pop("outcome_json")) if entry.outcome_json else None
    return out


def _audit_action(channel: grpc.Channel, request: pb.AuditActionRequest, resubmit: bool,
                  timeout_s: float) -> list[dict]:
    stub = pb_grpc.AdminStub(channel)
    reply = (stub.Resubmit if resubmit else stub.Discard)(request, timeout=timeout_s)
    out = []
    for r in reply.results:
        row = _to_dict(r)
        row["mark"] = json.loads(row.pop("mark_json")) if r.mark_json else None
        out.append(row)
    return out


def _status(channel: grpc.Channel, timeout_s: float) -> dict:
    out = _to_dict(pb_grpc.AdminStub(channel).Status(pb.StatusRequest(), timeout=timeout_s))
    out["peer_id"] = out["peer_id"] or out["node_id"]  # a peer that sends only node_id (mid-upgrade)
    return out


def _handover(channel: grpc.Channel, timeout_s: float) -> dict:
    request = pb.HandoverRequest(timeout_s=timeout_s)
    return _to_dict(pb_grpc.AdminStub(channel).Handover(request, timeout=timeout_s + HANDOVER_REPLY_MARGIN_S))


def _resume(channel: grpc.Channel, by: str, timeout_s: float) -> list[dict]:
    reply = pb_grpc.AdminStub(channel).Resume(pb.ResumeRequest(by=by), timeout=timeout_s)
    return [_to_dict(s) for s in reply.resumed]


def _to_dict(message) -> dict:
    out = {f.name: getattr(message, f.name) for f in message.DESCRIPTOR.fields}
    if "rule_pending" in out:  # a map field: a plain dict, as the status in Redis gives it
        out["rule_pending"] = dict(out["rule_pending"])
    return out


# ---- the one-call functions that were in twinflow.cluster.grpc_server ----------


def publish(address: str, flow: str, bodies: list[bytes], timeout_s: float = 10.0, *,
            security: GrpcSecurity = NO_SECURITY) -> list[str]:
    """One Publish call of ``bodies`` to ``flow`` at ``address``; their uplink positions.

    No batching and no retry (use :class:`Client` for those). Raises
    ``grpc.RpcError``; its ``code()`` is ``UNAVAILABLE`` when the peer or its
    uplink is down (safe to retry, at the risk of a duplicate entry) and
    ``RESOURCE_EXHAUSTED`` when the peer already runs its limit of publishes
    (nothing was written; retry after a pause).
    """
    with security.channel(address, "ingest") as channel:
        return _publish_once(channel, flow, list(bodies), timeout_s)


def peer_status(address: str, timeout_s: float = 5.0, *, security: GrpcSecurity = NO_SECURITY) -> dict:
    """The status of the peer at ``address`` as a dict with every field (``peer_id`` names it;
    ``node_id`` is the same under its old name). With the read token when ``security`` has one,
    else the admin token."""
    with security.channel(address, security.scope_to_send(STATUS)) as channel:
        return _status(channel, timeout_s)


def node_status(address: str, timeout_s: float = 5.0, *, security: GrpcSecurity = NO_SECURITY) -> dict:
    """Deprecated name of :func:`peer_status` (a process is a peer; a node is a graph node)."""
    warnings.warn("twinflow.client.node_status is deprecated: use peer_status", DeprecationWarning, stacklevel=2)
    return peer_status(address, timeout_s, security=security)


def request_handover(address: str, timeout_s: float = 5.0, *, security: GrpcSecurity = NO_SECURITY) -> dict:
    """Ask the peer at ``address`` to hand mastership over within ``timeout_s``; the reply as a dict."""
    with security.channel(address, "admin") as channel:
        return _handover(channel, timeout_s)
