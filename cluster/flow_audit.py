"""What a master step records when a message leaves the flow, beside the output itself: the
FAILED audit entry, the outcome of a resubmit, and the publisher's error notice.

:class:`StepAudit` belongs to one :class:`~twinflow.cluster.master_flow.MasterFlow`. It
decides per emission that leaves the flow (``MasterFlow._leave``) what to record, and
puts it in the step's ``records``, so the COMMIT that writes the output writes them too:
fenced by the master's epoch and all or nothing with the step (``scripts.COMMIT``).

- An unlinked ``failure`` or ``error`` outlink: one FAILED entry in ``tf:{F}:audit`` (flow,
  node, outlink, reason, the flow's time, the message's ID and document, its uplink
  position when the step took it, the peer and epoch, and ``resubmit_of``: the audit ID
  it was resubmitted from, if it was).
- A resubmitted message (``runtime/resubmit.py``) leaving by any outlink: its outcome in
  ``tf:{F}:audit:outcomes`` under the audit ID it was resubmitted from. Which resubmits the
  flow holds (fed, not yet left) is node state of its own, ``tf:{F}:state:~resubmits``
  (original ID -> audit IDs), written with each step and loaded with the flow's state,
  so an outcome is recorded when the message leaves in a later step (a retry, a join's
  time-out), also under a new master.
- An action's unlinked ``error`` outlink, or an outlink ``notices.outlinks`` names: an
  error notice per message in ``tf:{F}:notices`` (its publisher read in the script from
  ``tf:{F}:pub:<ID>``), the stream capped at ``notices.max_entries`` with the count of what
  the cap removed.

Under failure: nothing here touches Redis; what it records is written, or not, with the step.
A resubmit's in-flight entry is consumed by the first message with its original ID that
leaves the flow (a message ID is unique while the ID cache remembers it).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..runtime.audit_spec import AuditSpec, NoticeSpec
from ..runtime.json_text import compact
from ..runtime.nodes.action import ActionNode
from ..runtime.nodes.base import Emit

if TYPE_CHECKING:
    from ..runtime.flowgraph import FlowGraph
    from ..runtime.message import Message, Resubmitted
    from ..runtime.store.flow_keys import FlowKeys
    from ..runtime.store.step import Step

RESUBMITS = "~resubmits"  # the state the in-flight resubmits live in (no node can have the name)
FAILED_OUTLINKS = ("failure", "error")


def noticed_outlinks(graph: "FlowGraph", notices: NoticeSpec) -> frozenset[tuple[str, str]]:
    """Every (node, outlink) that gives a notice: each action's unlinked ``error``, and the ones
    the flow file names."""
    out = {(name, "error") for name, node in graph.nodes.items()
           if isinstance(node, ActionNode) and "error" not in graph.links.get(name, {})}
    return frozenset(out | set(notices.outlinks))


class StepAudit:
    """The audit, outcome and notice records of one master flow's steps (see the module doc)."""

    def __init__(self, graph: "FlowGraph", keys: "FlowKeys", peer_id: str, unlinked: set[tuple[str, str]]):
        spec = graph.cluster
        self.keys, self.peer_id, self.flow = keys, peer_id, keys.flow
        self.notices: NoticeSpec = spec.notices if spec is not None else NoticeSpec()
        self.audit: AuditSpec = spec.audit if spec is not None else AuditSpec()
        self.audited = frozenset(k for k in unlinked if k[1] in FAILED_OUTLINKS)
        self.noticed = noticed_outlinks(graph, self.notices)
        self.watched = self.audited | self.noticed  # an emission through these is recorded
        # original ID -> the audit IDs of its resubmits the flow holds now, as Redis holds them
        # after the last step (loaded), and the keys this step changed.
        self.inflight: dict[str, list[str]] = {}
        self._stored: set[str] = set()
        self._changed: set[str] = set()

    def load(self, entries: dict[str, Any]) -> None:
        """The in-flight resubmits as loaded from Redis (the ``RESUBMITS`` state)."""
        self.inflight = {k: list(v) for k, v in entries.items() if v}
        self._stored = set(self.inflight)

    def fed(self, m: "Resubmitted") -> None:
        """A resubmitted message enters the flow in this step."""
        self.inflight.setdefault(m.original_id, []).append(m.audit)
        self._changed.add(m.original_id)

    def changed_state(self) -> dict[str, list[str] | None]:
        """The in-flight entries this step changed (None: gone), as a node's ``changed_state``."""
        out: dict[str, list[str] | None] = {}
        for key in self._changed:
            value = self.inflight.get(key)
            if value:
                out[key] = list(value)
                self._stored.add(key)
            elif key in self._stored:
                out[key] = None
                self._stored.discard(key)
        self._changed.clear()
        return out

    def left(self, step: "Step", epoch: int, node: str, e: Emit, at: float, data: str | bytes,
             bodies: dict[str, "Message"]) -> None:
        """Record what ``e`` (through ``node``'s unlinked outlink, at the flow's time ``at``; its
        output's ``data`` as written) calls for in ``step``."""
        outlink = e.outlink
        reason = str(e.info.get("reason", "")) if e.info else ""
        resubmit_of = ""
        if self.inflight:
            for m in e.msgs:
                audit_ids = self.inflight.get(m.id)
                if not audit_ids:
                    continue
                audit_id = audit_ids.pop(0)
                if not audit_ids:
                    del self.inflight[m.id]
                self._changed.add(m.id)
                resubmit_of = resubmit_of or audit_id
                step.records.append(("M", self.keys.audit_outcomes, {audit_id: compact({
                    "node": node, "outlink": outlink, "reason": reason, "at": at, "peer": self.peer_id,
                    "epoch": epoch, "failed": outlink in FAILED_OUTLINKS and (node, outlink) in self.audited})}))
        key = (node, outlink)
        if key in self.audited:
            first = bodies.get(e.msgs[0].id) if len(e.msgs) == 1 else None
            fields = {"flow": self.flow, "node": node, "outlink": outlink, "reason": reason, "at": repr(at),
                      "id": "+".join(m.id for m in e.msgs), "position": first.position if first else "",
                      "peer": self.peer_id, "epoch": epoch, "resubmit_of": resubmit_of,
                      "info": json.dumps(dict(e.info), separators=(",", ":"), default=str) if e.info else "",
                      "data": data}
            step.records.append(("X", self.keys.audit, fields))
        if key in self.noticed:
            for m in e.msgs:
                known = bodies.get(m.id)
                step.records.append(("N", self.keys.notices, self.keys.publisher(m.id), self.keys.notices_removed,
                                     self.notices.max_entries,
                                     {"id": m.id, "flow": self.flow, "node": node, "outlink": outlink,
                                      "reason": reason, "at": repr(at),
                                      "position": known.position if known else ""}))
