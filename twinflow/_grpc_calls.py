"""Single gRPC calls to a peer, without retries: a Publish, a Status, a Handover, and the
encoding and batching of the bodies a publish sends.

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


def _publish_once(channel: grpc.Channel, flow: str, bodies: list[bytes], timeout_s: float) -> list[str]:
    request = pb.PublishRequest(flow=flow, messages=[pb.Envelope(body=b) for b in bodies])
    return list(pb_grpc.IngestStub(channel).Publish(request, timeout=timeout_s).positions)


def _status(channel: grpc.Channel, timeout_s: float) -> dict:
    out = _to_dict(pb_grpc.AdminStub(channel).Status(pb.StatusRequest(), timeout=timeout_s))
    out["peer_id"] = out["peer_id"] or out["node_id"]  # a peer that sends only node_id (mid-upgrade)
    return out


def _handover(channel: grpc.Channel, timeout_s: float) -> dict:
    request = pb.HandoverRequest(timeout_s=timeout_s)
    return _to_dict(pb_grpc.AdminStub(channel).Handover(request, timeout=timeout_s + HANDOVER_REPLY_MARGIN_S))


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
    ``node_id`` is the same under its old name)."""
    with security.channel(address, "admin") as channel:
        return _status(channel, timeout_s)


def node_status(address: str, timeout_s: float = 5.0, *, security: GrpcSecurity = NO_SECURITY) -> dict:
    """Deprecated name of :func:`peer_status` (a process is a peer; a node is a graph node)."""
    warnings.warn("twinflow.client.node_status is deprecated: use peer_status", DeprecationWarning, stacklevel=2)
    return peer_status(address, timeout_s, security=security)


def request_handover(address: str, timeout_s: float = 5.0, *, security: GrpcSecurity = NO_SECURITY) -> dict:
    """Ask the peer at ``address`` to hand mastership over within ``timeout_s``; the reply as a dict."""
    with security.channel(address, "admin") as channel:
        return _handover(channel, timeout_s)
