"""Backpressure, suspension and pace: whether and how fast a member's reader may plan batches.

Under failure (promise 5): a worker stops reading while another batch could
take its bake past ``max_pending``; it never drops. Every member stops
reading while the flow is suspended (an action node's retries used up with
``on_retry_failure: suspend``, as ``tf:{F}:suspended`` says), once its
stream has warmed up (a peer must warm up to contend for the master role,
and only a master ends a suspension): what it has not read waits in the
uplink, and what the master read meanwhile waits in the node, behind the
suspended message. A worker plans at most
every ``worker_pace_ms`` and reads ``worker_read_behind_ms`` behind; a master reads
everything as fast as it can (a read behind only delays what a worker bakes: whatever it has
not read when promoted, it reads then as master).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from .roles import MASTER

if TYPE_CHECKING:
    from .member import FlowMember
    from .collaborators import UplinkReading

log = logging.getLogger("twinflow.peer")


class ReaderControl:
    """A member's hold on, and pace of, the peer's uplink reading (see the module doc)."""

    def __init__(self, member: "FlowMember"):
        self.m = member
        self.reading: "UplinkReading | None" = None  # the peer's, once it runs
        self.held = False  # the reader plans no batch (backpressure, or the flow is suspended)
        self.pressure = False  # backpressure: the bake could pass max_pending
        self.suspended: dict[str, dict] = {}  # the flow's suspensions: action node -> id, reason, since, until
        self._paced_ms: tuple[int, int] | None = None  # the pace and read-behind as last set
        self._pace_lock = threading.Lock()  # the timer and a promotion both set the pace

    def attach(self, reading: "UplinkReading") -> None:
        """The peer's reading runs: hold and pace it from here on."""
        self.reading = reading
        self.pace()

    def pace(self) -> None:
        """A worker's reader plans at most every ``worker_pace_ms``: its batches only bake, and
        fewer, larger ones leave the cores to the master; and it reads ``worker_read_behind_ms``
        behind, so that under load most of what it reads is processed already and skipped, not
        baked. A master reads everything as fast as it can."""
        m = self.m
        # Under the lock, the role read and the pace set together: a timer that saw the
        # worker's role cannot set its pace after a promotion set the master's.
        with self._pace_lock:
            want = (0, 0) if m.state.role == MASTER else (m.cfg.worker_pace_ms, m.cfg.worker_read_behind_ms)
            if want != self._paced_ms and self.reading is not None:
                self.reading.pace(m, *want)
                self._paced_ms = want

    def set_suspended(self, held: dict[str, dict]) -> None:
        """The flow's suspensions as Redis (or the master's own step) says: hold while there is one."""
        m = self.m
        with m.state.lock:
            was, self.suspended = self.suspended, dict(held)
        for node, s in held.items():
            if was.get(node, {}).get("since") != s["since"]:
                m.event(logging.WARNING, "suspended", "%s: node %s suspended the flow on message %r until %.3f: %s",
                        m.cfg.peer_id, node, s["id"], s["until"], s["reason"], node=node, id=s["id"],
                        until=s["until"], reason=s["reason"])
        for node in set(was) - set(held):
            m.event(logging.INFO, "resumed", "%s: node %s no longer suspends the flow", m.cfg.peer_id, node, node=node)
        self.update_hold()

    def update_hold(self) -> None:
        """Hold the reader while the next batch might take the bake past max_pending, or while the
        flow is suspended."""
        m = self.m
        max_pending = m.spec.max_pending
        with m.state.lock:
            pending = m.claims.sort.pending
            pressure = m.state.role != MASTER and pending + m.intake.max_read_size > max_pending
            # Not before the stream's warm-up batch: a peer that never warmed up never contends for
            # the master role, and without a master no suspension would ever end.
            want = pressure or (bool(self.suspended) and m.state.streaming)
            was_pressure, self.pressure = self.pressure, pressure
            changed = want != self.held
            self.held = want
        if changed and self.reading is not None:
            self.reading.hold(m, want)
        if pressure == was_pressure:
            return
        if pressure:
            m.event(logging.WARNING, "backpressure_on",
                    "%s holds %d messages (max_pending %d): stopped reading until claims free room",
                    m.cfg.peer_id, pending, max_pending, pending=pending, max_pending=max_pending)
        else:
            m.event(logging.INFO, "backpressure_off", "%s reads again (%d messages held)",
                    m.cfg.peer_id, pending, pending=pending)
