"""A member's state: its role and epoch, the newest epoch it has seen, how far it handled the
uplink, whether it streams, and what it counted.

The role changes here only (:meth:`MemberState.become`), under the member's memory lock, so a
reader of the role and epoch under that lock never sees one without the other. The lock guards
memory only: no caller holds it across a Redis or ZooKeeper call, so status and handover answer
while a server hangs. Under failure nothing here can fail; the epoch seen only grows, and so
does the handled position.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

from ..runtime.positions import position_order
from .roles import MASTER, STARTING

# What a member counts (status and the metrics read them): per batch, step or escalation, never
# per message on a hot path. ``read`` is uplink entries read, ``fenced`` writes the fence refused.
COUNTED = ("delivered", "skipped", "failed", "rolled_back", "claims_unproven", "escalations_refused",
           "escalations_taken", "read", "fenced")


class MemberState:
    """Role, epochs, handled position, streaming and counts of one member (see the module doc)."""

    def __init__(self) -> None:
        # Memory only: never held across a Redis or ZooKeeper call. Re-entrant, so that a part
        # holding it (the worker's bake) may count or read the role inside.
        self.lock = threading.RLock()
        self.role = STARTING
        self.epoch = 0            # this member's epoch while master
        self.known_epoch = 0      # the newest epoch this member has seen anywhere
        self.handled_upto: str | None = None  # the last uplink position this member handled
        self.streaming = False
        self.streaming_since = 0.0
        self._counts: Counter = Counter({name: 0 for name in COUNTED})

    # -- the role: changed here only ------------------------------------------------
    def become(self, role: str, epoch: int | None = None) -> None:
        """Take ``role`` (as master, at ``epoch``, which the member has then seen too)."""
        if role == MASTER and epoch is None:
            raise ValueError("a master takes the role at an epoch")
        with self.lock:
            if role == MASTER:
                self.epoch = epoch
                self.known_epoch = max(self.known_epoch, epoch)
            self.role = role

    def shown_epoch(self) -> int:
        """The epoch status and log lines show: its own as master, else the newest seen."""
        return self.epoch if self.role == MASTER else self.known_epoch

    def role_and_epoch(self) -> tuple[str, int]:
        with self.lock:
            return self.role, self.epoch

    def saw_epoch(self, epoch: int) -> None:
        """Remember ``epoch`` as seen (the newest only ever grows)."""
        with self.lock:
            if epoch > self.known_epoch:
                self.known_epoch = epoch

    # -- the uplink -------------------------------------------------------------------
    def handled(self, position: str | None) -> None:
        """This member handled the uplink up to ``position`` (it never moves back; None: nowhere yet)."""
        if position is None:
            return
        with self.lock:
            if self.handled_upto is None or position_order(position) > position_order(self.handled_upto):
                self.handled_upto = position

    def start_streaming(self) -> bool:
        """The reading's first batch ran; True the first time only."""
        with self.lock:
            if self.streaming:
                return False
            self.streaming_since = time.time()
            self.streaming = True
            return True

    # -- counts -----------------------------------------------------------------------
    def count(self, **deltas: int) -> None:
        """Add to the named counts (names in COUNTED)."""
        with self.lock:
            self._counts.update(deltas)

    def counts(self) -> dict[str, int]:
        with self.lock:
            return dict(self._counts)

    def __getitem__(self, name: str) -> int:
        return self._counts[name]
