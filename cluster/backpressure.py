"""Backpressure and pace: how fast a member's reader may plan batches.

Under failure (promise 5): a worker stops reading while another batch could
take its bake past ``max_pending``; it never drops. A worker plans at most
every ``worker_pace_ms`` and reads ``worker_read_behind_ms`` behind; a master reads
everything as fast as it can (a read behind only delays what a worker bakes: whatever it has
not read when promoted, it reads then as master).
"""

from __future__ import annotations

import logging

from .roles import MASTER

log = logging.getLogger("twinflow.peer")


class Backpressure:
    """A member's reader hold and pace (mixed into FlowMember)."""

    def _pace(self) -> None:
        """A worker's reader plans at most every ``worker_pace_ms``: its batches only bake, and
        fewer, larger ones leave the cores to the master; and it reads ``worker_read_behind_ms``
        behind, so that under load most of what it reads is processed already and skipped, not
        baked. A master reads everything as fast as it can."""
        # Under the lock, the role read and the file written together: a timer that saw the
        # worker's role cannot write its pace after a promotion wrote the master's.
        with self._pace_lock:
            want = (0, 0) if self.role == MASTER else (self.cfg.worker_pace_ms, self.cfg.worker_read_behind_ms)
            if want != self._paced_ms and self.reading is not None:
                self.reading.pace(self, *want)
                self._paced_ms = want

    # -- backpressure -----------------------------------------------------
    def _update_backpressure(self) -> None:
        """Hold the reader while the next batch might take the bake past max_pending."""
        with self._lock:
            want = self.role != MASTER and self.sort.pending + self.max_read_size > self.spec.max_pending
            if want == self.held:
                return
            self.held = want
            pending = self.sort.pending
        if self.reading is not None:
            self.reading.hold(self, want)
        if want:
            self._event(logging.WARNING, "backpressure_on",
                        "%s holds %d messages (max_pending %d): stopped reading until claims free room",
                        self.cfg.peer_id, pending, self.spec.max_pending, pending=pending,
                        max_pending=self.spec.max_pending)
        else:
            self._event(logging.INFO, "backpressure_off", "%s reads again (%d messages held)",
                        self.cfg.peer_id, pending, pending=pending)
