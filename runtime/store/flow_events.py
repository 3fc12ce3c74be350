"""A flow's events stream in Redis: its peers' records of role changes and failovers.

``tf:{F}:events`` (one hash slot with the flow's other keys) is a stream the peers add
their records to (``cluster/member_events.py``): promoted, demoted, first_write and the
other events a timeline of the flow shows. Each entry has the fields ``event``, ``peer``,
``epoch`` and ``at`` (the flow's time, seconds) as text, and every other field of the
record as one JSON text (``fields``), so that nested values come back as they went in.
The stream keeps about the newest ``EVENTS_MAX`` entries (``XADD MAXLEN ~``).

Under failure: :meth:`FlowEvents.add_events` makes one attempt, bounded by the
client's socket timeout, and returns False instead of raising, so that its caller keeps
the records for its next try; a reply lost after Redis applied the write makes that try
add them again (a reader sees the same record twice). Nothing here retries or waits.
:meth:`FlowEvents.events` reads through the store's retrying call (``redis_calls.py``).
"""

from __future__ import annotations

import json
from typing import Any, Iterable

EVENTS_MAX = 1000  # entries the stream keeps, about (MAXLEN ~: Redis trims whole nodes)
_FIXED = ("event", "peer", "epoch", "at")  # the fields kept as text of their own


def entry_fields(record: dict[str, Any]) -> dict[str, str]:
    """A record as the stream's entry holds it: the fixed fields as text, the rest as JSON.

    >>> entry_fields({"event": "promoted", "peer": "a", "epoch": 3, "at": 10.5, "phases": {"x": 1}})
    {'event': 'promoted', 'peer': 'a', 'epoch': '3', 'at': '10.5', 'fields': '{"phases":{"x":1}}'}
    """
    rest = {k: v for k, v in record.items() if k not in _FIXED}
    out = {k: "" if record.get(k) is None else str(record[k]) for k in _FIXED}
    # default=str: a field a caller passed that JSON cannot hold is kept as its text, never refused.
    out["fields"] = json.dumps(rest, separators=(",", ":"), default=str)
    return out


def read_entry(entry_id: bytes | str, raw: dict) -> dict[str, Any]:
    """One stream entry back as a record: ``id``, ``event``, ``peer``, ``epoch`` (int or None),
    ``at`` (float) and the record's other fields."""
    f = {(k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
         for k, v in raw.items()}
    try:
        rest = json.loads(f.get("fields") or "{}")
    except ValueError:
        rest = {}
    if not isinstance(rest, dict):
        rest = {}
    epoch = f.get("epoch") or ""
    return {**rest, "id": entry_id.decode() if isinstance(entry_id, bytes) else entry_id,
            "event": f.get("event", ""), "peer": f.get("peer", ""),
            "epoch": int(epoch) if epoch.isdigit() else None, "at": float(f.get("at") or 0.0)}


class FlowEvents:
    """The events calls of a :class:`~.flow_store.FlowStore` (it provides ``r``, ``keys``, ``_call``)."""

    def add_events(self, records: Iterable[dict[str, Any]], max_entries: int = EVENTS_MAX) -> bool:
        """Add ``records`` (each with ``event``, ``peer``, ``epoch``, ``at`` and any other fields) to
        the events stream in one pipelined round trip, in order; one attempt. True once Redis took
        them, False when it did not (nothing raised: the caller keeps them for its next try)."""
        entries = [entry_fields(r) for r in records]
        if not entries:
            return True

        def write():
            pipe = self.r.pipeline(transaction=False)
            for fields in entries:
                pipe.xadd(self.keys.events, fields, maxlen=max_entries, approximate=True)
            pipe.execute()

        try:
            self.call("add events", write, deadline_s=0)
        except Exception:  # Redis down, slow, closed: the records wait for the caller's next round
            return False
        return True

    def events(self, count: int = 50, deadline_s: float | None = None) -> list[dict[str, Any]]:
        """The newest ``count`` records of the events stream, newest first (see :func:`read_entry`)."""
        raw = self.call("read events", lambda: self.r.xrevrange(self.keys.events, count=count), deadline_s)
        return [read_entry(entry_id, fields) for entry_id, fields in raw]
