"""The master's upkeep of the flow's audit: the retention trim, and the counts the metrics report.

A part of the member (``member.py``), called from the master's trim round
(``member_timers.py``). Each trim removes the audit entries past ``audit.retention`` (on the
flow's clock) and beyond ``audit.max_entries``, a bounded number per call
(``AuditStore.trim``); every removed entry that was still FAILED (never resubmitted or
discarded) is added to ``removed_unhandled`` in Redis by the same script, and logged as the
event ``audit_removed_unhandled``. After the trim the counts are read once, for the metrics,
which never call Redis at scrape time for them.

Under failure: :meth:`AuditUpkeep.trim` never raises: Redis unreachable (each call tries once)
leaves the audit as it is until the next round, and the counts as last read.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from ..runtime.store.audit import AuditStore

if TYPE_CHECKING:
    from .member import FlowMember

log = logging.getLogger("twinflow.peer")

MAX_CALLS = 10  # trim calls one round makes at most (each removes at most audit.TRIM_BUDGET entries)


class AuditUpkeep:
    """A member's audit trim and counts (see the module doc)."""

    def __init__(self, member: "FlowMember"):
        self.m = member
        self._counts: dict[str, int] | None = None

    def trim(self) -> None:
        """Trim the audit as the flow file's ``audit`` section says, then read its counts."""
        m = self.m
        spec = m.spec.audit
        audit = AuditStore(m.store)
        try:
            removed = unhandled = 0
            for _ in range(MAX_CALLS):
                result = audit.trim(spec.retention, spec.max_entries, m.clock.now(), deadline_s=0)
                removed, unhandled = removed + result.removed, unhandled + result.unhandled
                if not result.more:
                    break
            self._counts = audit.counts(deadline_s=0)
        except Exception as exc:  # noqa: BLE001 - the upkeep waits for the next round
            log.warning("%s: the audit was not trimmed this round: %s: %s", m.cfg.peer_id, type(exc).__name__, exc)
            return
        if unhandled:
            m.event(logging.WARNING, "audit_removed_unhandled",
                    "%s: the audit's retention removed %d entries, %d of them never resubmitted nor discarded",
                    m.cfg.peer_id, removed, unhandled, removed=removed, count=unhandled)
        elif removed:
            log.info("%s: the audit's retention removed %d handled entries", m.cfg.peer_id, removed)

    def counts(self) -> dict[str, int] | None:
        """The audit's counts as last read (``AuditStore.counts``), or None before the first trim."""
        return self._counts
