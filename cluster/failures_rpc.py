"""The gRPC side of a flow's failures: the Admin service's Failures, Resubmit and Discard, and the
Ingest service's Notices, as requests and replies of ``proto/twinflow/wire/twinflow.proto``
over :class:`~twinflow.cluster.flow_failures.FlowFailures`.

The servicers (``grpc_server.py``) stay thin: they hand each request here with the flow's
:class:`FlowFailures`, and this module makes the same store calls ``twinflow failures`` makes
over Redis. A resubmit or discard names who did it: the request's ``by``, else the caller's
gRPC peer address.

Under failure: a request that cannot be served as asked (another flow, a bad filter or cursor)
is answered ``INVALID_ARGUMENT`` before anything is done; Redis unreachable is ``UNAVAILABLE``
with the reason; a resubmit or discard refused for one entry (unknown, marked before, not
resubmittable) is that entry's result, with its reason, and changed nothing.
"""

from __future__ import annotations

import json
from typing import Callable

import grpc

from twinflow.runtime.store.audit import STATUSES, AuditError, AuditFilter
from twinflow.runtime.store.store_errors import RedisUnavailable, StoreClosed
from twinflow.wire import twinflow_pb2 as pb

from .flow_failures import ActionResult, FlowFailures

DEFAULT_LIST = 100


def audit_filter(request) -> AuditFilter:
    """The filter a FailuresRequest asks for; ValueError for a status it does not know."""
    status = (request.status or "FAILED").upper()
    if status not in (*STATUSES, "ANY"):
        raise ValueError(f"status {request.status!r} is not one of {', '.join(STATUSES)} or ANY")
    return AuditFilter(node=request.node or None, reason=request.reason or None,
                       since=request.since or None, until=request.until or None,
                       status="" if status == "ANY" else status)


def _entry(row: dict) -> pb.AuditEntry:
    def number(name: str, kind):
        try:
            return kind(row.get(name) or 0)
        except ValueError:
            return kind(0)

    return pb.AuditEntry(
        audit_id=row["audit_id"], status=row["status"], flow=row.get("flow", ""), node=row.get("node", ""),
        outlink=row.get("outlink", ""), reason=row.get("reason", ""), at=number("at", float),
        message_id=row.get("id", ""), message=row["message"].encode(), position=row.get("position", ""),
        peer=row.get("peer", ""), epoch=number("epoch", int), resubmit_of=row.get("resubmit_of", ""),
        mark_json=json.dumps(row["mark"]) if row.get("mark") else "",
        outcome_json=json.dumps(row["outcome"]) if row.get("outcome") else "")


def _result(r: ActionResult) -> pb.AuditActionResult:
    return pb.AuditActionResult(audit_id=r.audit_id, ok=r.ok, reason=r.reason, refusal=r.refusal,
                                mark_json=json.dumps(r.mark) if r.mark else "")


def _serve(context, failures: FlowFailures, flow: str, call: Callable):
    """``call()``, its errors answered as gRPC statuses (see the module doc)."""
    if flow and flow != failures.name:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"wrong flow {flow!r}: this peer serves {failures.name!r}")
    try:
        return call()
    except ValueError as exc:
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
    except (RedisUnavailable, ConnectionError) as exc:
        context.abort(grpc.StatusCode.UNAVAILABLE, f"Redis of flow {failures.name!r} unavailable: {exc}")
    except StoreClosed:
        context.abort(grpc.StatusCode.UNAVAILABLE, f"flow {failures.name!r}: the peer is stopping")


def failures_reply(failures: FlowFailures, request, context) -> pb.FailuresReply:
    """Failures: one entry (``audit_id``; NOT_FOUND when there is none), or a filtered listing."""
    def call():
        if request.audit_id:
            try:
                return pb.FailuresReply(entries=[_entry(failures.show(request.audit_id))])
            except AuditError as exc:
                context.abort(grpc.StatusCode.NOT_FOUND, exc.reason)
        rows = failures.list(audit_filter(request), request.limit or DEFAULT_LIST, request.after or None)
        return pb.FailuresReply(entries=[_entry(r) for r in rows])

    return _serve(context, failures, request.flow, call)


def action_reply(failures: FlowFailures, request, context, resubmit: bool) -> pb.AuditActionReply:
    """Resubmit or Discard: the listed audit IDs, or every entry the filter takes."""
    def call():
        if request.all_matching == bool(request.audit_ids):
            raise ValueError("name audit IDs, or ask for all_matching with a filter, not both or neither")
        refs = list(request.audit_ids) or failures.matching(audit_filter(request.filter))
        by = request.by or context.peer()
        results = failures.resubmit(refs, by) if resubmit else failures.discard(refs, by)
        return pb.AuditActionReply(results=[_result(r) for r in results])

    return _serve(context, failures, request.flow, call)


def notices_reply(failures: FlowFailures, request, context) -> pb.NoticesReply:
    """Notices: the publisher's notices after the cursor, and the cursor to continue from."""
    def call():
        found, cursor = failures.notices(request.publisher or None, request.after or None, request.max or 100)
        notices = []
        for n in found:
            try:
                at = float(n.get("at") or 0)
            except ValueError:
                at = 0.0
            notices.append(pb.Notice(cursor=n["cursor"], id=n.get("id", ""), flow=n.get("flow", ""),
                                     node=n.get("node", ""), outlink=n.get("outlink", ""),
                                     reason=n.get("reason", ""), at=at, position=n.get("position", ""),
                                     publisher=n.get("publisher", "")))
        return pb.NoticesReply(notices=notices, cursor=cursor)

    return _serve(context, failures, request.flow, call)
