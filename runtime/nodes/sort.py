"""The SortNode in claim mode, as pure logic (seed 002, "claim mode").

The worker of an active-active pair bakes every message it reads from the
uplink; the master escalates each message it processed. A claim releases
every baked message at or below the claimed key to ``bypass``; a message
whose ID is already known to be processed is never baked. A message that
stays unclaimed for ``bake_time`` seconds means the master fell behind or
died: it leaves through ``unclaimed_outlink`` (``done`` by default, as the
seed's text says; ``failure`` as QFlow's code did) so it is surfaced, but the
node keeps it, because routing it out must never make it unrecoverable: it
stays eligible for :meth:`rollback` until a claim or :meth:`forget` proves
it was processed.

Nothing here reads a clock or touches a server: callers pass ``now`` and
call :meth:`tick` at :meth:`next_deadline`.

Claims and uplink order. Claiming "every message at or below the key" is
only safe when the master has processed all of them, which holds when keys
grow in uplink order. A claim therefore also carries the uplink position of
the claiming message and releases only baked messages at or before it; a
message with a lower key that sits later in the uplink waits for its own
claim (the master escalates every message) instead of being lost on failover.

>>> from twinflow.runtime.message import Message
>>> node = ClaimSortNode(bake_time=5.0)
>>> node.offer(Message("a", 1, "10-0", b"{}"), now=0.0) is None  # baked
True
>>> [m.id for m in node.claim("a", 1, "10-0")]
['a']
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from typing import Any, Iterable

from ..message import Message, position_order

OUTLINKS = ("done", "bypass", "failure", "nohit")


class ClaimSortNode:
    """Bakes messages until the master claims them; see the module docstring."""

    def __init__(self, bake_time: float, unclaimed_outlink: str = "done", max_pending: int = 1_000_000):
        if bake_time <= 0:
            raise ValueError("bake_time must be > 0 in claim mode")
        if unclaimed_outlink not in ("done", "failure"):
            raise ValueError("unclaimed_outlink must be 'done' or 'failure'")
        self.bake_time = bake_time
        self.unclaimed_outlink = unclaimed_outlink
        self.max_pending = max_pending
        # position -> (message, ready_at); insertion order is uplink order
        # because messages are offered in the order the uplink holds them.
        self._baked: OrderedDict[str, tuple[Message, float]] = OrderedDict()
        # Fully baked but unclaimed: already routed out, still recoverable.
        self._overdue: OrderedDict[str, Message] = OrderedDict()
        self._by_id: dict[str, set[str]] = {}
        self.claimed = 0      # released to bypass (by a claim or as already processed)
        self.unclaimed = 0    # routed to unclaimed_outlink after baking fully
        self.rolled_back = 0  # handed back for processing by rollback()

    # -- state ------------------------------------------------------------
    @property
    def baked(self) -> int:
        """Messages still baking."""
        return len(self._baked)

    @property
    def pending(self) -> int:
        """Messages the node holds (baking or overdue): what a rollback would return."""
        return len(self._baked) + len(self._overdue)

    @property
    def full(self) -> bool:
        """True at max_pending: the caller must stop reading (backpressure), not drop."""
        return self.pending >= self.max_pending

    def next_deadline(self) -> float | None:
        """When the oldest baking message is fully baked, or None."""
        for _, ready_at in self._baked.values():
            return ready_at
        return None

    # -- input ------------------------------------------------------------
    def offer(self, msg: Message, now: float, processed: bool = False) -> str | None:
        """Take one uplink message. Returns the outlink it left by, or None if baked.

        ``processed`` says its ID is already in the ID cache: it is not baked.
        """
        if processed:
            self.claimed += 1
            return "bypass"
        if msg.position in self._baked or msg.position in self._overdue:
            return None  # the same uplink entry read again (a replayed batch)
        self._baked[msg.position] = (msg, now + self.bake_time)
        self._by_id.setdefault(msg.id, set()).add(msg.position)
        return None

    def claim(self, msg_id: str, key: Any, position: str) -> list[Message]:
        """Release (to bypass) the message ``msg_id`` and every message at or
        below ``key`` that sits at or before ``position`` in the uplink."""
        upto = position_order(position)
        take = set(self._by_id.get(msg_id, ()))
        for store in (self._baked, self._overdue):
            for pos, entry in store.items():
                if position_order(pos) > upto:
                    break
                msg = entry[0] if isinstance(entry, tuple) else entry
                if msg.key <= key:
                    take.add(pos)
        released = [self._remove(pos) for pos in sorted(take, key=position_order)]
        self.claimed += len(released)
        return released

    def tick(self, now: float) -> list[Message]:
        """Route every fully baked message to the unclaimed outlink; they stay recoverable."""
        out: list[Message] = []
        while self._baked:
            pos, (msg, ready_at) = next(iter(self._baked.items()))
            if ready_at > now:
                break
            del self._baked[pos]
            self._overdue[pos] = msg
            out.append(msg)
        self.unclaimed += len(out)
        return out

    def overdue_ids(self) -> list[str]:
        """IDs of routed-out but unclaimed messages, to check against the ID cache."""
        return [m.id for m in self._overdue.values()]

    def forget(self, processed_ids: Iterable[str]) -> int:
        """Drop messages whose IDs turned out to be processed (found in the ID cache).

        Baking ones leave through bypass like a claim; overdue ones already left.
        Returns how many were dropped.
        """
        n = 0
        for msg_id in processed_ids:
            for pos in list(self._by_id.get(msg_id, ())):
                if pos in self._baked:
                    self.claimed += 1
                self._remove(pos)
                n += 1
        return n

    def rollback(self) -> list[Message]:
        """Every unclaimed message (baking and overdue), in uplink order; the node is empty after."""
        baked = (m for m, _ in self._baked.values())
        out = list(heapq.merge(baked, self._overdue.values(), key=lambda m: position_order(m.position)))
        self._baked.clear()
        self._overdue.clear()
        self._by_id.clear()
        self.rolled_back += len(out)
        return out

    def _remove(self, pos: str) -> Message:
        entry = self._baked.pop(pos, None)
        msg = entry[0] if entry is not None else self._overdue.pop(pos)
        ids = self._by_id.get(msg.id)
        if ids is not None:
            ids.discard(pos)
            if not ids:
                del self._by_id[msg.id]
        return msg
