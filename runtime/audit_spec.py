"""The flow file's ``audit`` and ``notices`` sections: how long failed messages are kept for an
operator, and which failures a publisher is told of.

::

    audit: {retention: 7d, max_entries: 100000}
    notices: {outlinks: [guard.failure], max_entries: 10000}

``audit``: every message that leaves the flow through an unlinked ``failure`` or
``error`` outlink, and every uplink entry the flow cannot take at all (the
failure stream), is kept as a FAILED entry of the flow's audit until it is
older than ``retention`` (seconds, or a number with ``s``, ``m``, ``h`` or
``d``) or more than ``max_entries`` newer entries exist
(docs/operations/failures.md).

``notices``: an action's unlinked ``error`` outlink always writes an error notice
for the message's publisher; ``outlinks`` names more unlinked outlinks as
``<node>.<outlink>``. The notice stream keeps about ``max_entries`` notices.

Under failure: nothing here touches a server. A value that cannot be used is
refused at load with FlowFileError naming the file, line, field and reason;
nothing is defaulted from a wrong value.

>>> from twinflow.runtime.params import Doc, Params
>>> doc = Doc("audit: {retention: 2h}\\n", "f.yaml")
>>> read_audit(Params(doc, "", doc.value)).retention
7200.0
>>> read_audit(Params(Doc("audit: {retention: soon}\\n", "f.yaml"), "", {"audit": {"retention": "soon"}}))
Traceback (most recent call last):
...
twinflow.runtime.params.FlowFileError: f.yaml:1: audit.retention: must be seconds, or a number with s, m, h or d \
such as 90s, 15m or 7d, in [60 s, 3650 d] (got 'soon')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .durations import FORMS, duration_s
from .params import Params

__all__ = ["AuditSpec", "NoticeSpec", "read_audit", "read_notices"]

MIN_RETENTION_S = 60.0
MAX_RETENTION_S = 3650 * 86400.0
MAX_ENTRIES = 10_000_000


@dataclass(frozen=True)
class AuditSpec:
    """How long the flow's audit keeps an entry (seconds) and how many it keeps at most."""

    retention: float = 7 * 86400.0
    max_entries: int = 100_000


@dataclass(frozen=True)
class NoticeSpec:
    """The unlinked outlinks whose messages give their publisher a notice, besides every action's
    ``error``, and how many notices the stream keeps."""

    outlinks: tuple[tuple[str, str], ...] = ()
    max_entries: int = 10_000


def read_audit(top: Params) -> AuditSpec:
    """The ``audit`` section (defaults when it is absent)."""
    sec = top.section("audit", default={}).only("retention", "max_entries")
    retention = AuditSpec.retention
    if sec.has("retention"):
        raw = sec.value["retention"]
        retention = duration_s(raw)
        if retention is None or not MIN_RETENTION_S <= retention <= MAX_RETENTION_S:
            raise sec.error("retention", f"must be {FORMS}, in [60 s, 3650 d] (got {raw!r})")
    max_entries = sec.get("max_entries", int, AuditSpec.max_entries, check=lambda v: 1 <= v <= MAX_ENTRIES,
                          why=f"must be 1..{MAX_ENTRIES}")
    return AuditSpec(retention=retention, max_entries=max_entries)


def read_notices(top: Params, outlinks: Mapping[str, tuple[str, ...] | None],
                 links: Mapping[str, Mapping[str, str]]) -> NoticeSpec:
    """The ``notices`` section; ``outlinks`` are each node's outlinks and ``links`` the linked ones
    (what the graph has), so that a name that cannot leave the flow is refused here."""
    sec = top.section("notices", default={}).only("outlinks", "max_entries")
    named: list[tuple[str, str]] = []
    for i, item in enumerate(sec.str_list("outlinks", [], nonempty=False)):
        where = f"{sec.field_name('outlinks')}[{i}]"
        node, dot, outlink = item.rpartition(".")
        if not dot or not node or not outlink:
            raise sec.doc.error(where, f"must be <node>.<outlink> (got {item!r})")
        if node not in outlinks:
            raise sec.doc.error(where, f"names node {node!r}, which is not a node of this flow's graph")
        if outlinks[node] is None:  # a node refused on its own (twinflow validate): not checked against
            continue
        if outlink not in outlinks[node]:
            raise sec.doc.error(where, f"node {node!r} has no outlink {outlink!r} "
                                       f"(it has: {', '.join(outlinks[node])})")
        if outlink in links.get(node, {}):
            raise sec.doc.error(where, f"{item} links to {links[node][outlink]!r}: only an outlink through which "
                                       f"messages leave the flow can give a notice")
        if (node, outlink) not in named:
            named.append((node, outlink))
    max_entries = sec.get("max_entries", int, NoticeSpec.max_entries, check=lambda v: 1 <= v <= MAX_ENTRIES,
                          why=f"must be 1..{MAX_ENTRIES}")
    return NoticeSpec(outlinks=tuple(named), max_entries=max_entries)
