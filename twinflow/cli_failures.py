"""``twinflow failures list | show | resubmit | discard``: the audit of a flow's failed messages,
over Redis (``--redis``) or through a peer's Admin service (``--peer HOST:PORT``).

Both ways make the same store calls (``cluster/flow_failures.py``). A resubmit runs each
message exactly once more, from the node it failed at; the entry is marked RESUBMITTED with
``--by`` (default: the operator's OS user) and the time. docs/operations/failures.md shows
the commands.

Under failure: an audit ID that does not exist, an entry resubmitted or discarded before, or
one that cannot be resubmitted is reported on stderr with the reason and changes nothing;
the command then ends with exit code 1 (the other entries named are still done). Redis or
the peer unreachable ends it with ``EXIT_UNAVAILABLE``; a bad flag value with exit code 2,
before anything is done.
"""

from __future__ import annotations

import getpass
import json
import sys
import time
from datetime import datetime, timezone

from twinflow.runtime.durations import UNITS, duration_s
from twinflow.cli_common import EXIT_UNAVAILABLE, _grpc_security, _load_flow, _table

REDIS_DEADLINE_S = 10.0  # a command's Redis call waits at most this long for Redis
GRPC_TIMEOUT_S = 60.0
COLUMNS = ["audit_id", "status", "at", "node", "outlink", "id", "reason"]


def moment(text: str, now: float | None = None) -> float:
    """Epoch seconds from ``text``: epoch seconds, an ISO 8601 time (UTC unless it says), or a
    span before ``now`` such as ``90m`` or ``2d``; ValueError naming the forms otherwise.

    >>> moment("1700000000"), moment("2023-11-14T22:13:20Z"), moment("2h", now=10000.0)
    (1700000000.0, 1700000000.0, 2800.0)
    """
    text = text.strip()
    try:
        return float(text)
    except ValueError:
        pass
    ago = duration_s(text) if text[-1:] in UNITS else None  # a plain number was epoch seconds, above
    if ago is not None:
        return (time.time() if now is None else now) - ago
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a time: give epoch seconds, an ISO time such as "
                         f"2026-11-28T10:00:00Z, or a span ago such as 90m or 2d") from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def _filters(args) -> dict:
    return {"node": args.node, "reason": args.reason,
            "since": moment(args.since) if args.since else None,
            "until": moment(args.until) if args.until else None}


def cmd_failures(args) -> int:
    try:
        filters = _filters(args)
    except ValueError as exc:
        print(f"twinflow failures: {exc}", file=sys.stderr)
        return 2
    action = args.action
    if action in ("resubmit", "discard") and bool(args.ids) == bool(args.all):
        print(f"twinflow failures {action}: name audit IDs, or pass --all (with --node, --reason, --since "
              f"or --until to narrow it), not both", file=sys.stderr)
        return 2
    if action == "show" and len(args.ids) != 1:
        print("twinflow failures show: name one audit ID", file=sys.stderr)
        return 2
    graph = _load_flow(args.flow)
    via = _OverGrpc(args, graph) if args.peer else _OverRedis(args)
    try:
        return _run(args, via, filters)
    except via.unavailable as exc:
        print(f"twinflow failures: {via.where} did not answer: {via.describe(exc)}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    finally:
        via.close()


def _run(args, via, filters: dict) -> int:
    from twinflow.runtime.store.audit import time_text

    if args.action == "list":
        rows = via.list(filters, args.status, args.limit, args.after)
        if args.json:
            print(json.dumps({"flow": via.name, "entries": rows}))
        elif not rows:
            print(f"flow {via.name}: no {args.status.lower()} entries" if args.status != "ANY"
                  else f"flow {via.name}: no entries")
        else:
            print(_table(COLUMNS, [[r["audit_id"], r["status"], time_text(r.get("at")), r.get("node") or "-",
                                    r.get("outlink") or "-", r.get("id") or r.get("message_id") or "-",
                                    _clip(r.get("reason", ""))] for r in rows]))
            if len(rows) == args.limit:
                print(f"(the first {args.limit}: --after {rows[-1]['audit_id']} lists on)")
        return 0
    if args.action == "show":
        row = via.show(args.ids[0])
        if row is None:
            return 1
        print(json.dumps(row) if args.json else _shown(row))
        return 0
    by = args.by or getpass.getuser()
    results = via.act(args.action == "resubmit", args.ids, filters, by)
    done = {"resubmit": "resubmitted", "discard": "discarded"}[args.action]
    for r in results:
        if args.json:
            print(json.dumps(r))
        elif r["ok"]:
            where = f" (uplink {r['mark']['position']})" if (r.get("mark") or {}).get("position") else ""
            print(f"{r['audit_id']}: {done} by {by}{where}")
        else:
            print(f"twinflow failures {args.action}: {r['audit_id']}: {r['reason']}", file=sys.stderr)
    refused = sum(not r["ok"] for r in results)
    if not args.json:
        print(f"{len(results) - refused} {done}, {refused} refused")
    return 1 if refused else 0


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _shown(row: dict) -> str:
    from twinflow.runtime.store.audit import time_text

    lines = [f"audit ID     {row['audit_id']}", f"status       {row['status']}"]
    for label, key in (("flow", "flow"), ("node", "node"), ("outlink", "outlink"), ("reason", "reason"),
                       ("message ID", "id"), ("position", "position"), ("peer", "peer"), ("epoch", "epoch"),
                       ("resubmit of", "resubmit_of")):
        value = row.get(key) if key != "id" else (row.get("id") or row.get("message_id"))
        if value:
            lines.append(f"{label:<12} {value}")
    lines.append(f"{'at':<12} {time_text(row.get('at'))}")
    mark = row.get("mark")
    if mark:
        where = f", envelope at uplink {mark['position']}" if mark.get("position") else ""
        lines.append(f"{'mark':<12} {mark.get('status')} at {time_text(mark.get('at'))} by {mark.get('by')}{where}")
    outcome = row.get("outcome")
    if outcome:
        lines.append(f"{'outcome':<12} left by {outcome.get('node')}.{outcome.get('outlink')} at "
                     f"{time_text(outcome.get('at'))}" + (f": {outcome['reason']}" if outcome.get("reason") else ""))
    elif mark and mark.get("status") == "RESUBMITTED":
        lines.append(f"{'outcome':<12} not yet: the resubmit has not left the flow")
    lines.append("message")
    lines.append(row.get("message", ""))
    return "\n".join(lines)


class _OverRedis:
    """The audit read and changed in Redis directly (the flow's stores, one per shard)."""

    def __init__(self, args):
        import redis

        from twinflow.cli_peer import _flow_stores
        from twinflow.cluster.flow_failures import FlowFailures
        from twinflow.runtime.store.store_errors import RedisUnavailable

        graph, self.stores = _flow_stores(args)
        for store in self.stores:
            store.call_deadline_s = REDIS_DEADLINE_S
        spec = graph.cluster
        self.name, self.where = graph.name, "Redis"
        self.failures = FlowFailures(graph.name, self.stores, max_bytes=spec.message.max_bytes,
                                     replicas=spec.wait_replicas, replica_wait_ms=spec.replica_wait_ms)
        self.unavailable = (RedisUnavailable, redis.RedisError)

    def describe(self, exc: BaseException) -> str:
        from twinflow.secrets import redact_text

        return redact_text(str(exc))

    def list(self, filters: dict, status: str, limit: int, after: str | None) -> list[dict]:
        from twinflow.runtime.store.audit import AuditFilter

        return self.failures.list(AuditFilter(**filters, status="" if status == "ANY" else status), limit, after)

    def show(self, audit_id: str) -> dict | None:
        from twinflow.runtime.store.audit import AuditError

        try:
            return self.failures.show(audit_id)
        except AuditError as exc:
            print(f"twinflow failures show: {exc.reason}", file=sys.stderr)
            return None

    def act(self, resubmit: bool, ids: list[str], filters: dict, by: str) -> list[dict]:
        from twinflow.runtime.store.audit import AuditFilter

        refs = ids or self.failures.matching(AuditFilter(**filters))
        results = self.failures.resubmit(refs, by) if resubmit else self.failures.discard(refs, by)
        return [r.as_dict() for r in results]

    def close(self) -> None:
        for store in self.stores:
            store.close()


class _OverGrpc:
    """The audit through a peer's Admin service (the first of ``--peer`` that answers)."""

    def __init__(self, args, graph):
        import grpc

        from twinflow.client import Client

        # list and show only read: the read token when one is named, else admin; the actions, admin.
        security = _grpc_security(args, graph, reads=args.action in ("list", "show"))
        self.name, self.where = graph.name, f"peer {', '.join(args.peer)}"
        self.client = Client(args.peer, graph.name, security)
        self.unavailable = (grpc.RpcError,)

    def describe(self, exc: BaseException) -> str:
        code = exc.code() if hasattr(exc, "code") else None
        return f"{code.name if code else ''}: {exc.details() if hasattr(exc, 'details') else exc}"

    def list(self, filters: dict, status: str, limit: int, after: str | None) -> list[dict]:
        return self.client.failures(**filters, status=status, limit=limit, after=after, timeout_s=GRPC_TIMEOUT_S)

    def show(self, audit_id: str) -> dict | None:
        import grpc

        try:
            return self.client.failure(audit_id, timeout_s=GRPC_TIMEOUT_S)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            print(f"twinflow failures show: {exc.details()}", file=sys.stderr)
            return None

    def act(self, resubmit: bool, ids: list[str], filters: dict, by: str) -> list[dict]:
        call = self.client.resubmit if resubmit else self.client.discard
        return call(ids, all_matching=not ids, by=by, timeout_s=GRPC_TIMEOUT_S, **filters)

    def close(self) -> None:
        self.client.close()
