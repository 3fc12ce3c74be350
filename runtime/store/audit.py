"""The flow's audit of failed messages in Redis: list, show, resubmit, discard, trim, counts.

Every message that leaves the flow by an unlinked ``failure`` or ``error`` outlink is a FAILED
entry of ``tf:{F}:audit``, written by the master's COMMIT with the step
(``cluster/flow_audit.py``), and so is every uplink entry the flow could not take at all,
written with its failure record (``scripts.RECORD_FAILURE``). The entry's audit ID is its
stream entry ID. :class:`AuditStore` is what an operator's tools (``twinflow failures``, over
Redis or through a peer's Admin service) do with them, over a
:class:`~.flow_store.FlowStore`'s retrying calls.

A resubmit puts the entry's message back into the flow as one uplink entry, an envelope
(``runtime/resubmit.py``) processed under an identity of its own, so it runs exactly once more
though its ID is in the ID cache; the entry is marked RESUBMITTED, with who and when, by the
same script (``audit_scripts.AUDIT_MARK``). A discard marks it DISCARDED. When the resubmitted
message leaves the flow, its outcome is recorded under the audit ID.

Under failure: every call waits for Redis up to its deadline (``redis_calls.py``) and raises
RedisUnavailable after it. A resubmit or discard changes nothing unless it is applied whole:
an audit ID that does not exist, an entry marked before, or an entry that cannot be resubmitted
raises :class:`AuditError` with the reason, and a call retried after a lost reply finds its own
mark (one envelope on the uplink, never two). A trim removes only entries past the retention
or the size, and adds every one it removes that was still FAILED to a count in Redis. A mark
or an outcome that is not the JSON object this code writes is read as ``{"malformed": text}``
(the entry's status MALFORMED, and never resubmitted): one bad value never fails a listing.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Iterator

from .. import resubmit
from ..json_text import loads
from . import scripts

if TYPE_CHECKING:
    from .flow_store import FlowStore

FAILED, RESUBMITTED, DISCARDED = "FAILED", "RESUBMITTED", "DISCARDED"
STATUSES = (FAILED, RESUBMITTED, DISCARDED)
MALFORMED = "MALFORMED"  # the status shown for an entry whose mark is not one this code wrote
PAGE = 500            # entries read per round trip when listing
TRIM_BUDGET = 10_000  # entries one trim call removes at most (a longer script would hold Redis)


class AuditError(RuntimeError):
    """A resubmit or discard refused, nothing changed: ``kind`` is ``missing`` (no such audit ID),
    ``marked`` (resubmitted or discarded before) or ``unusable`` (the entry cannot be resubmitted)."""

    def __init__(self, kind: str, audit_id: str, reason: str):
        super().__init__(reason)
        self.kind, self.audit_id, self.reason = kind, audit_id, reason


def time_text(seconds: Any) -> str:
    """Epoch seconds as UTC text, to the millisecond.

    >>> time_text(1700000000.25)
    '2023-11-14T22:13:20.250Z'
    """
    try:
        moment = datetime.fromtimestamp(float(seconds), timezone.utc)
    except (TypeError, ValueError, OverflowError, OSError):
        return str(seconds)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


@dataclass
class AuditEntry:
    """One audit entry as read back, with its status (its mark's, else FAILED) and outcome."""

    id: str
    fields: dict[str, str]   # as written (data apart)
    data: bytes
    mark: dict | None = None
    outcome: dict | None = None

    @property
    def status(self) -> str:
        return self.mark.get("status", FAILED) if self.mark else FAILED

    @property
    def node(self) -> str:
        return self.fields.get("node", "")

    @property
    def reason(self) -> str:
        return self.fields.get("reason", "")

    @property
    def at(self) -> float | None:
        try:
            return float(self.fields.get("at", ""))
        except ValueError:
            return None

    def as_dict(self) -> dict:
        """Plain values (the message as text), as ``twinflow failures`` and the Admin service give them."""
        return {"audit_id": self.id, "status": self.status, **self.fields,
                "message": self.data.decode("utf-8", "replace"), "mark": self.mark, "outcome": self.outcome}


@dataclass(frozen=True)
class AuditFilter:
    """Which entries a listing or a resubmit of many takes: ``node`` exactly, ``reason`` as a
    substring, ``since``/``until`` (epoch seconds, inclusive) on the time the entry was written
    (its audit ID), ``status`` one of STATUSES or "" for any."""

    node: str | None = None
    reason: str | None = None
    since: float | None = None
    until: float | None = None
    status: str = FAILED

    def __post_init__(self) -> None:
        if self.status not in ("", *STATUSES):
            raise ValueError(f"status must be one of {', '.join(STATUSES)} or empty, not {self.status!r}")

    def matches(self, entry: AuditEntry) -> bool:
        return ((self.node is None or entry.node == self.node)
                and (not self.reason or self.reason in entry.reason)
                and (not self.status or entry.status == self.status))

    def id_range(self) -> tuple[str, str]:
        low = "-" if self.since is None else f"{max(0, int(self.since * 1000))}-0"
        high = "+" if self.until is None else f"{max(0, int(self.until * 1000))}-18446744073709551615"
        return low, high


@dataclass(frozen=True)
class TrimResult:
    removed: int      # entries removed by this trim
    unhandled: int    # of them, still FAILED (counted in Redis)
    more: bool        # more are due (the budget stopped it)
    entries: int      # entries kept
    failed: int       # of them, FAILED


def _text(raw: Any) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _json(raw: Any, status: str | None = None) -> dict | None:
    """A mark or an outcome as written, a JSON object; one that is not (written by hand, cut,
    corrupted) is ``{"malformed": its text}``, with ``status`` MALFORMED for a mark, so that a
    listing shows it as such instead of failing whole."""
    if raw is None:
        return None
    try:
        value = loads(raw)
    except ValueError:
        value = None
    if isinstance(value, dict):
        return value
    malformed = {"malformed": _text(raw)}
    return {"status": status, **malformed} if status else malformed


class AuditStore:
    """The audit of the flow (or shard) ``store`` holds (see the module doc)."""

    def __init__(self, store: "FlowStore"):
        self.store, self.keys = store, store.keys

    # -- reading ----------------------------------------------------------
    def entries(self, filt: AuditFilter = AuditFilter(), limit: int = 100, after: str | None = None,
                deadline_s: float | None = None) -> list[AuditEntry]:
        """Up to ``limit`` entries ``filt`` takes, oldest first, after the audit ID ``after``."""
        out: list[AuditEntry] = []
        for entry in self.scan(filt, after, deadline_s):
            out.append(entry)
            if len(out) >= limit:
                break
        return out

    def scan(self, filt: AuditFilter = AuditFilter(), after: str | None = None,
             deadline_s: float | None = None) -> Iterator[AuditEntry]:
        """Every entry ``filt`` takes, oldest first, after ``after``, read a page at a time."""
        low, high = filt.id_range()
        if after is not None:
            low = "(" + after
        while True:
            page = self._page(low, high, deadline_s)
            for entry in page:
                if filt.matches(entry):
                    yield entry
            if len(page) < PAGE:
                return
            low = "(" + page[-1].id

    def _page(self, low: str, high: str, deadline_s: float | None) -> list[AuditEntry]:
        store, keys = self.store, self.keys

        def read():  # store.r read at each attempt: a retry may follow the flow's primary elsewhere
            r = store.r
            rows = r.xrange(keys.audit, low, high, count=PAGE)
            marks = r.hmget(keys.audit_marks, [i for i, _ in rows]) if rows else []
            return rows, marks

        rows, marks = self.store.call("read the audit", read, deadline_s)
        return [self._entry(i, f, m) for (i, f), m in zip(rows, marks)]

    @staticmethod
    def _entry(raw_id: Any, raw_fields: dict, mark: Any, outcome: Any = None) -> AuditEntry:
        fields = {_text(k): v for k, v in raw_fields.items()}
        data = fields.pop("data", b"")
        return AuditEntry(_text(raw_id), {k: _text(v) for k, v in fields.items()},
                          data if isinstance(data, bytes) else str(data).encode(), _json(mark, MALFORMED),
                          _json(outcome))

    def entry(self, audit_id: str, deadline_s: float | None = None) -> AuditEntry | None:
        """The entry ``audit_id`` with its mark and outcome, or None when the audit has none."""
        if not resubmit.AUDIT_ID.fullmatch(audit_id):
            return None
        store, keys = self.store, self.keys

        def read():
            pipe = store.r.pipeline(transaction=True)
            pipe.xrange(keys.audit, audit_id, audit_id)
            pipe.hget(keys.audit_marks, audit_id)
            pipe.hget(keys.audit_outcomes, audit_id)
            return pipe.execute()

        rows, mark, outcome = self.store.call("read an audit entry", read, deadline_s)
        return self._entry(rows[0][0], rows[0][1], mark, outcome) if rows else None

    def counts(self, deadline_s: float | None = None) -> dict[str, int]:
        """entries and FAILED among them now; removed and removed_unhandled by trims so far;
        notices_removed by the notice stream's cap."""
        store, keys = self.store, self.keys

        def read():
            pipe = store.r.pipeline(transaction=True)
            pipe.xlen(keys.audit)
            pipe.hlen(keys.audit_marks)
            pipe.hmget(keys.audit_counts, ["removed", "removed_unhandled"])
            pipe.get(keys.notices_removed)
            return pipe.execute()

        entries, marked, (removed, unhandled), notices = self.store.call("audit counts", read, deadline_s)
        return {"entries": int(entries), "failed": max(0, int(entries) - int(marked)),
                "removed": int(removed or 0), "removed_unhandled": int(unhandled or 0),
                "notices_removed": int(notices or 0)}

    # -- marking ----------------------------------------------------------
    def resubmit(self, audit_id: str, by: str, *, max_bytes: int = 1 << 20, deadline_s: float | None = None,
                 replicas: int = 0, replica_wait_ms: int = 1000) -> dict:
        """Put the message of ``audit_id`` back into the flow, once, and mark the entry RESUBMITTED
        by ``by``; the mark (status, by, at, the envelope's uplink ``position``). AuditError when
        the entry does not exist, was marked before, or cannot be resubmitted (its message is not
        a JSON object, was cut to the failure stream's size, or its envelope would be over
        ``max_bytes``, ``message.max_bytes``). With ``replicas`` > 0 it returns only once that
        many replicas have it, as a publish does."""
        entry = self.entry(audit_id, deadline_s)
        if entry is None:
            raise AuditError("missing", audit_id, self.missing(audit_id))
        if entry.mark:
            raise AuditError("marked", audit_id, self._marked(audit_id, entry.mark))
        body = self._envelope(entry, max_bytes)
        return self._mark(audit_id, RESUBMITTED, by, body, deadline_s, replicas, replica_wait_ms)

    def discard(self, audit_id: str, by: str, *, deadline_s: float | None = None) -> dict:
        """Mark ``audit_id`` DISCARDED by ``by`` (nothing goes back into the flow); the mark.
        AuditError when the entry does not exist or was marked before."""
        return self._mark(audit_id, DISCARDED, by, b"", deadline_s, 0, 1000)

    def _mark(self, audit_id: str, status: str, by: str, body: bytes, deadline_s: float | None,
              replicas: int, replica_wait_ms: int) -> dict:
        if not resubmit.AUDIT_ID.fullmatch(audit_id):
            raise AuditError("missing", audit_id, self.missing(audit_id))
        keys = [self.keys.audit, self.keys.audit_marks, self.keys.uplink]
        args = [audit_id, status, by, uuid.uuid4().hex, body]
        store = self.store

        def write(pipe):
            scripts.queue(pipe, store.scripts["audit_mark"], keys, args)

        (reply,) = store.write_durably(f"{status.lower()} an audit entry", write, deadline_s, replicas=replicas,
                                wait_ms=replica_wait_ms)
        code = int(reply[0])
        if code == 0:
            raise AuditError("missing", audit_id, self.missing(audit_id))
        mark = _json(reply[1], MALFORMED)
        if code == 2:
            raise AuditError("marked", audit_id, self._marked(audit_id, mark))
        mark.pop("token", None)
        return mark

    def missing(self, audit_id: str) -> str:
        """The reason given when the audit has no entry ``audit_id``."""
        return f"flow {self.keys.flow} has no audit entry {audit_id!r} (never written, or removed by the retention)"

    @staticmethod
    def _marked(audit_id: str, mark: dict) -> str:
        if "malformed" in mark:
            return f"audit entry {audit_id} has a mark twinflow did not write ({MALFORMED}); nothing changed"
        done = str(mark.get("status", "marked")).lower()
        return (f"audit entry {audit_id} was already {done} at {time_text(mark.get('at'))} "
                f"by {mark.get('by') or '?'}; nothing changed")

    def _envelope(self, entry: AuditEntry, max_bytes: int) -> bytes:
        """The uplink body that resubmits ``entry``; AuditError (unusable) when there is none."""
        def unusable(why: str) -> AuditError:
            return AuditError("unusable", entry.id, f"audit entry {entry.id} cannot be resubmitted: {why}; "
                                                    f"nothing changed")

        size = entry.fields.get("size", "")
        if size.lstrip("-").isdigit() and int(size) > len(entry.data):
            raise unusable(f"the audit kept {len(entry.data)} of its {size} bytes")
        try:
            doc = json.loads(entry.data)
        except ValueError:
            doc = None
        if not isinstance(doc, dict):
            raise unusable(f"its message is not a JSON object the flow can read ({entry.reason or 'bad input'}); "
                           f"publish a corrected message instead")
        node, message_id = entry.node, entry.fields.get("id", "")
        if resubmit.KEY in doc:  # the envelope of an earlier resubmit that could not be taken: its message
            try:
                _, node, inner_id, doc = resubmit.read_envelope(doc)
            except ValueError as exc:
                raise unusable(f"it holds a resubmit envelope that cannot be read ({exc})") from None
            message_id = inner_id or ""
        body = resubmit.envelope(entry.id, node, doc, message_id)
        if len(body) > max_bytes:
            raise unusable(f"its resubmit would be {len(body)} bytes, over message.max_bytes ({max_bytes})")
        return body

    # -- retention --------------------------------------------------------
    def trim(self, retention_s: float, max_entries: int, now_s: float, budget: int = TRIM_BUDGET,
             deadline_s: float | None = 0) -> TrimResult:
        """Remove the entries older than ``retention_s`` at ``now_s`` (the flow's time) and the
        oldest beyond ``max_entries``, at most ``budget`` (more: ``TrimResult.more``), counting
        those still FAILED in Redis (``audit_scripts.TRIM_AUDIT``)."""
        cutoff = f"{max(0, int((now_s - retention_s) * 1000))}-0"
        keys = [self.keys.audit, self.keys.audit_marks, self.keys.audit_outcomes, self.keys.audit_counts]
        reply = self.store.call("trim the audit", lambda: self.store.scripts["trim_audit"](
            keys=keys, args=[cutoff, max_entries, budget]), deadline_s)
        removed, unhandled, more, entries, failed = (int(x) for x in reply)
        return TrimResult(removed, unhandled, bool(more), entries, failed)
