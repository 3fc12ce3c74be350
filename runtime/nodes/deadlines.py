"""The one deadline queue of the nodes: at most one deadline per key, fired in time order.

Every node that waits for time keeps its deadlines here: join (an AND
group's or an XOR window's time-out), aggregate (a group's decaying
time-out), resequence (missing message and idle), sequence (idle) and
action (a retry). A node's state object for a key is a :class:`Timed`; the
queue finds it by key. A deadline is part of its key's state entry
(:func:`timed_entry`), so a node loaded from Redis sets the same deadlines
again, in the order they were set (:func:`load_order`, :func:`restore_timer`).

>>> open_ = {}
>>> timers = GroupTimers(open_.get)
>>> for key, at in [("a", 5.0), ("b", 3.0)]:
...     open_[key] = Timed(key)
...     timers.set(open_[key], at)
>>> timers.next(), timers.pop(4.0)[1].key, timers.pop(4.0)
(3.0, 'b', None)
"""

from __future__ import annotations

import heapq
import json
from itertools import count
from typing import Callable, Hashable, Mapping



class Timed:
    """What :class:`GroupTimers` keeps on a group's state object: its key and one deadline."""

    __slots__ = ("key", "due", "stamp", "live_at", "live_stamp")

    def __init__(self, key: Hashable):
        self.key = key
        self.due: float | None = None  # the deadline, or None
        self.stamp = 0                 # when it was set: equal deadlines fire in that order
        self.live_at = 0.0             # the group's entry in the heap, if live_stamp is set
        self.live_stamp: int | None = None


class GroupTimers:
    """At most one deadline per open group, fired in time order.

    A heap with lazy deletion: moving a deadline later (the common case: a
    timer restarted by a new message) pushes nothing; the old entry is
    re-pushed at the real time when it reaches the top. Only a first or an
    earlier deadline pushes, so a set or a cancel costs O(1) or O(log n).
    Entries of cancelled or closed groups stay until they surface; when they
    outnumber the live ones three to one the heap is rebuilt (amortised O(1)
    a push), so it holds at most about four entries per group with a
    deadline. Entries name the group by key and ``lookup`` finds its state:
    a closed group's state is freed at once, and entries made of plain values
    are left alone by the garbage collector, which keeps the cost flat as
    groups grow.
    """

    def __init__(self, lookup: Callable[[Hashable], Timed | None]):
        self._lookup = lookup
        self._heap: list[tuple[float, int, Hashable]] = []
        self._stamps = count()
        self._live = 0  # groups with a deadline

    def set(self, g: Timed, at: float) -> None:
        if g.due is None:
            self._live += 1
        g.due, g.stamp = at, next(self._stamps)
        if g.live_stamp is None or at < g.live_at:
            heapq.heappush(self._heap, (at, g.stamp, g.key))
            g.live_at, g.live_stamp = at, g.stamp
            if len(self._heap) > 4 * self._live + 64:
                self._compact()

    def cancel(self, g: Timed) -> None:
        """Drop ``g``'s deadline (a closing group must drop it too)."""
        if g.due is not None:
            g.due = None
            self._live -= 1

    def next(self) -> float | None:
        heap = self._heap
        if heap:  # the engine asks before every message: answer a settled top without a call
            at, stamp, key = heap[0]
            g = self._lookup(key)
            if g is not None and g.stamp == stamp and g.due is not None:
                return at
            self._settle()
        return heap[0][0] if heap else None

    def due(self, now: float) -> bool:
        """Cheap test: may a deadline be at or before ``now``?"""
        return bool(self._heap) and self._heap[0][0] <= now

    def pop(self, now: float) -> tuple[float, Timed] | None:
        """The earliest deadline at or before ``now`` and its group, removed; or None."""
        self._settle()
        if not self._heap or self._heap[0][0] > now:
            return None
        at, _, key = heapq.heappop(self._heap)
        g = self._lookup(key)
        g.due = g.live_stamp = None
        self._live -= 1
        return at, g

    def _own(self, stamp: int, key: Hashable) -> Timed | None:
        """The open group whose live entry this is, or None for a stale entry."""
        g = self._lookup(key)
        return g if g is not None and g.live_stamp == stamp else None

    def _compact(self) -> None:
        heap = []
        for e in self._heap:
            g = self._own(e[1], e[2])
            if g is None:
                continue
            if g.due is None:
                g.live_stamp = None
            else:
                heap.append(e)  # kept even if early: it is re-pushed when it surfaces
        heapq.heapify(heap)
        self._heap = heap

    def _settle(self) -> None:
        # Make the top entry a group's true deadline, dropping stale entries.
        heap = self._heap
        while heap:
            _, stamp, key = heap[0]
            g = self._own(stamp, key)
            if g is None:
                heapq.heappop(heap)
            elif g.due is None:
                heapq.heappop(heap)
                g.live_stamp = None
            elif g.stamp != stamp:  # moved later since it was pushed
                heapq.heapreplace(heap, (g.due, g.stamp, key))
                g.live_at, g.live_stamp = g.due, g.stamp
            else:
                return


def timed_entry(g: Timed, entry: dict) -> dict:
    """A group's state entry with its deadline (and the order of equal deadlines) added."""
    if g.due is not None:
        entry["d"], entry["s"] = g.due, g.stamp
    return entry


def load_order(entries: Mapping[str, dict]) -> list[tuple[Hashable, dict]]:
    """Entries as (group key, entry), deadlines in the order they were set (see restore_timer)."""
    items = [(json.loads(k), v) for k, v in entries.items()]
    items.sort(key=lambda kv: (kv[1].get("d") is None, kv[1].get("d") or 0.0, kv[1].get("s", 0)))
    return items


def restore_timer(timers: GroupTimers, g: Timed, entry: dict) -> None:
    """Set a loaded group's deadline; called in load_order, so equal deadlines keep their order."""
    if entry.get("d") is not None:
        timers.set(g, entry["d"])
