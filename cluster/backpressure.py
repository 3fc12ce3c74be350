"""Backpressure and pace: how fast a member's reader may plan batches.

Under failure (promise 5): a worker stops reading while another batch could
take its bake past ``max_pending``; it never drops. A worker plans at most
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
    from .parts import UplinkReading

log = logging.getLogger("twinflow.peer")


class ReaderControl:
    """A member's hold on, and pace of, the peer's uplink reading (see the module doc)."""

    def __init__(self, member: "FlowMember"):
        self.m = member
        self.reading: "UplinkReading | None" = None  # the peer's, once it runs
        self.held = False  # backpressure: the reader plans no batch
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

    def update_hold(self) -> None:
        """Hold the reader while the next batch might take the bake past max_pending."""
        m = self.m
        max_pending = m.spec.max_pending
        with m.state.lock:
            pending = m.claims.sort.pending
            want = m.state.role != MASTER and pending + m.intake.max_read_size > max_pending
            if want == self.held:
                return
            self.held = want
        if self.reading is not None:
            self.reading.hold(m, want)
        if want:
            m.event(logging.WARNING, "backpressure_on",
                    "%s holds %d messages (max_pending %d): stopped reading until claims free room",
                    m.cfg.peer_id, pending, max_pending, pending=pending, max_pending=max_pending)
        else:
            m.event(logging.INFO, "backpressure_off", "%s reads again (%d messages held)",
                    m.cfg.peer_id, pending, pending=pending)
