"""A member's records of role changes and failovers, on their way to the flow's events stream.

:meth:`FlowMember.event` hands every operator event to :meth:`MemberEvents.note`; those worth
a timeline (``TIMELINE``) become records: the event's name, this peer, the epoch, when (the
flow's clock, seconds: Redis's time, so that peers on different machines agree) and the
event's fields. ``note`` only appends to a bounded queue in memory: its callers (the election,
the batch thread, kazoo's event thread) may hold locks, and none of them waits for Redis for a
record. The timer round (``member_timers.py``) and a stopping member call :meth:`flush`, which
writes what is queued to ``tf:{F}:events`` (``runtime/store/flow_events.py``).

A ``promoted`` record gets ``master_lost_at`` as it is flushed: the old master's last sign of
life, the ``at`` or ``last_batch_at`` of its status in Redis, which outlives ZooKeeper's session
time-out (the status's TTL is max(5, 4 × the status interval) s). It is read once the role was
taken, on the timer thread, never on the promotion's path.

Under failure: when Redis does not take them, the records stay queued for the next round. The
queue keeps the newest ``QUEUE_MAX``; a record pushed out unwritten is counted (``dropped``,
``events_dropped`` in the status). A reply lost after Redis took the records has them added
again by the next round. The status read for ``master_lost_at`` is one attempt: when it fails
the flush waits for the next round; when the old master's status is gone, not a master's, or
newer than this peer's election (a handover, a paused master come back), the record goes
without it.
"""

from __future__ import annotations

import threading
from collections import deque
from typing import TYPE_CHECKING, Any

from .roles import MASTER

if TYPE_CHECKING:
    from .member import FlowMember

# The events a timeline of the flow shows (docs/reference/logs.md names each); the others are
# only logged. ``handover`` is the member's record of a handover asked of it.
TIMELINE = frozenset({
    "started", "stopping", "promoted", "demoted", "rolled_back", "first_write", "fenced", "lease_expired",
    "handover", "promotion_refused", "zk_session_lost", "suspended", "resumed",
})
QUEUE_MAX = 200  # records kept while Redis does not take them: a few failovers' worth
_FIXED = ("event", "peer", "epoch", "at")


class MemberEvents:
    """A member's queue of records for the events stream (see the module doc)."""

    def __init__(self, member: "FlowMember"):
        self.m = member
        self._queue: deque[list] = deque(maxlen=QUEUE_MAX)  # [serial, record, master_lost_at to look up]
        self._lock = threading.Lock()  # the queue, in memory only: never held across a Redis call
        self._flushing = threading.Lock()  # one flush at a time (the timer round, a stopping member)
        self._serial = 0
        self.dropped = 0  # records pushed out of the queue unwritten

    def note(self, name: str, fields: dict[str, Any]) -> None:
        """Queue a record of event ``name`` with ``fields`` (its ``epoch`` among them) when it is
        one a timeline shows. Memory only: no Redis call, no wait."""
        if name not in TIMELINE:
            return
        m = self.m
        record: dict[str, Any] = {"event": name, "peer": m.cfg.peer_id, "epoch": fields.get("epoch"),
                                  "at": round(m.clock.now(), 3)}
        for key, value in fields.items():
            if key not in _FIXED and key != "exc_info" and value is not None:
                record[key] = value
        with self._lock:
            if len(self._queue) == QUEUE_MAX:
                self.dropped += 1
            self._serial += 1
            self._queue.append([self._serial, record, name == "promoted"])

    def queued(self) -> list[dict[str, Any]]:
        """The records not written yet, oldest first."""
        with self._lock:
            return [record for _, record, _ in self._queue]

    def flush(self, wait_s: float = 0.0) -> bool:
        """Write the queued records to the events stream, one attempt; True when none is left
        queued. Never raises: a timer round must go on. ``wait_s``: how long to wait for a flush
        another thread has under way (a stopping member's last flush must not be the one skipped)."""
        got = self._flushing.acquire(timeout=wait_s) if wait_s > 0 else self._flushing.acquire(blocking=False)
        if not got:
            return False  # another thread is writing them now
        try:
            with self._lock:
                batch = list(self._queue)
            if not batch:
                return True
            store = self.m.store
            if any(look for _, _, look in batch):
                try:
                    statuses = store.read_statuses(deadline_s=0)
                except Exception:  # Redis down: this round writes nothing either
                    return False
                for entry in batch:
                    if entry[2]:
                        self._master_lost(entry[1], statuses)
                        entry[2] = False
            if not store.add_events([record for _, record, _ in batch]):
                return False
            last = batch[-1][0]
            with self._lock:
                while self._queue and self._queue[0][0] <= last:
                    self._queue.popleft()
            return True
        finally:
            self._flushing.release()

    def _master_lost(self, record: dict[str, Any], statuses: list[dict]) -> None:
        """Add ``master_lost_at`` to a promoted ``record``: the newest of the old master's status
        time and last batch, if its status is there, says master and is not newer than this
        peer's election (``session_expired_at``)."""
        me, old = self.m.cfg.peer_id, record.get("old_master")
        elected = record.get("session_expired_at")
        for row in statuses:
            peer = row.get("peer_id")
            if peer == me or row.get("role") != MASTER or (old is not None and peer != old):
                continue
            lost = max(_seconds(row.get("at")), _seconds(row.get("last_batch_at")))
            if lost > 0 and (elected is None or lost <= elected):
                record["master_lost_at"] = round(lost, 3)
                record.setdefault("old_master", peer)
                return


def _seconds(text: Any) -> float:
    try:
        return float(text or 0)
    except (TypeError, ValueError):
        return 0.0
