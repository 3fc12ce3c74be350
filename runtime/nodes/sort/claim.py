"""The claim logic, once: messages bake until the master claims them (QFlow's claim mode).

:class:`ClaimCache` is what both claim-mode users hold: the sort node's
claim rulesets (replay) and :class:`ClaimSortNode`, the worker's
half of a cluster's claim pair. Nothing here reads a clock or touches a
server.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ...positions import position_order
from .min_queue import MinQueue

if TYPE_CHECKING:
    from ...message import Message

DONE, BYPASS, FAILURE = "done", "bypass", "failure"


class _Held:
    """One message held by a ClaimCache; ``live`` turns False when it leaves (lazy deletion)."""

    __slots__ = ("item", "ident", "key", "order", "serial", "overdue", "live")

    def __init__(self, item: Any, ident: str, key: Any, order: Any, serial: int):
        self.item, self.ident, self.key, self.order, self.serial = item, ident, key, order, serial
        self.overdue = False
        self.live = True


_ORDER = attrgetter("order")


class ClaimCache:
    """Messages baking until the master claims them: the claim logic of both sort nodes.

    Each held message has an ID, a key, an uplink ``order`` (anything that
    sorts: a stream position, an arrival number) and a ready time. A claim
    releases the message with the claimed ID and every message at or below
    the claimed key that sits at or before the claim's own uplink order. A
    message past its ready time is overdue: reported once by :meth:`expire`,
    but still held, so a claim, :meth:`release_upto` or :meth:`rollback` decides
    where it ends. Claims cost O(log n) per released message; nothing scans
    the whole cache except :meth:`rollback`.

    >>> cache = ClaimCache()
    >>> for n in (1, 2, 3):
    ...     _ = cache.offer(f"m{n}", f"m{n}", key=n, order=n, ready_at=5.0)
    >>> cache.claim("m2", 2, upto=2), cache.rollback()
    (['m1', 'm2'], ['m3'])
    """

    def __init__(self):
        self._held: dict[Any, _Held] = {}           # order -> held message (baking or overdue)
        self._by_id: dict[str, list[_Held]] = {}
        self._by_key = MinQueue()                  # (key, serial, held); left ones are skipped
        self._by_ready = MinQueue()                # (ready_at, serial, held) of baking ones
        self._by_order = MinQueue()                # (order, serial, held); left ones are skipped
        self._serial = 0                            # breaks ties so held objects are never compared
        self.baking = 0
        self.claimed = 0      # released by a claim or the mark while baking, or never baked (processed)
        self.unclaimed = 0    # reported overdue by expire()
        self.rolled_back = 0  # returned by rollback()

    def __len__(self) -> int:
        return len(self._held)

    def offer(self, item: Any, ident: str, key: Any, order: Any, ready_at: float,
              processed: bool = False) -> str | None:
        """Bake ``item`` until ``ready_at``; ``"bypass"`` (not baked) when ``processed``.

        An ``order`` already held is the same uplink entry read again: ignored.
        """
        if processed:
            self.claimed += 1
            return BYPASS
        if order in self._held:
            return None
        self._serial += 1
        held = _Held(item, ident, key, order, self._serial)
        self._held[order] = held
        same = self._by_id.get(ident)
        if same is None:
            self._by_id[ident] = [held]
        else:
            same.append(held)
        self._by_key.push((key, held.serial, held))
        self._by_ready.push((ready_at, held.serial, held))
        self._by_order.push((order, held.serial, held))
        self.baking += 1
        return None

    def claim(self, ident: str, key: Any, upto: Any) -> list:
        """Release the messages with ID ``ident``, and those at or below ``key`` up to ``upto``.

        Returns their items in uplink order.
        """
        taken = self.take(ident, key, upto)
        return self.settle(taken, [True] * len(taken))

    def take(self, ident: str, key: Any, upto: Any) -> list[tuple[_Held, bool]]:
        """What :meth:`claim` would release, still held: a claim taken as a hint, to be proven
        (say, against the ID cache) and then passed to :meth:`settle`. Until then no other claim
        takes them again; :meth:`release_upto` and :meth:`rollback` still may."""
        taken = []
        queue = self._by_key
        for entry in queue.pop_upto(key):
            held = entry[2]
            if not held.live:
                continue
            if held.order > upto:
                queue.push(entry)  # later in the uplink than the claim: not proven processed
            else:
                taken.append((held, True))
        for held in self._by_id.get(ident, ()):
            if held.key > key or held.order > upto:  # not taken above: its ID proves it processed
                taken.append((held, False))
        return taken

    def settle(self, taken: list[tuple[_Held, bool]], proven: list[bool]) -> list:
        """Release the taken messages whose claim was ``proven``; keep the rest baking, as if
        the claim had never come. Returns the released items in uplink order."""
        released = []
        for (held, from_key_queue), ok in zip(taken, proven):
            if not held.live or self._held.get(held.order) is not held:
                continue  # left meanwhile (the mark, a rollback, another claim)
            if ok:
                self._drop(held)
                released.append(held)
            elif from_key_queue:
                self._by_key.push((held.key, held.serial, held))
        released.sort(key=_ORDER)
        self.claimed += len(released)
        self._compact()
        return [h.item for h in released]

    def expire(self, now: float) -> list:
        """Mark every message ready at or before ``now`` overdue; return their items, in ready order."""
        out = []
        for _, _, held in self._by_ready.pop_upto(now):
            if held.live:  # not claimed meanwhile
                held.overdue = True
                out.append(held.item)
        self.baking -= len(out)
        self.unclaimed += len(out)
        return out

    def next_deadline(self) -> float | None:
        """When the next baking message becomes overdue, or None."""
        queue = self._by_ready
        while queue:
            ready_at, _, held = queue.peek()
            if held.live:
                return ready_at
            queue.pop()  # claimed before it was ready
        return None

    def release_upto(self, upto: Any) -> int:
        """Drop every held message at or before uplink order ``upto`` (proven processed
        in bulk: the flow's processed mark); return how many.

        A baking one counts as claimed; an overdue one was already reported.
        Costs O(log n) per released message, whatever the cache holds.
        """
        n = 0
        for _, _, held in self._by_order.pop_upto(upto):
            if held.live:
                if not held.overdue:
                    self.claimed += 1
                self._drop(held)
                n += 1
        self._compact()
        return n

    def rollback(self) -> list:
        """Every held item (baking and overdue) in uplink order; the cache is empty after."""
        out = [h.item for h in sorted(self._held.values(), key=_ORDER)]
        self._held.clear()
        self._by_id.clear()
        self._by_key = MinQueue()
        self._by_ready = MinQueue()
        self._by_order = MinQueue()
        self.baking = 0
        self.rolled_back += len(out)
        return out

    def _drop(self, held: _Held) -> None:
        held.live = False
        del self._held[held.order]
        if not held.overdue:
            self.baking -= 1
        same = self._by_id[held.ident]
        if len(same) == 1:
            del self._by_id[held.ident]
        else:
            same.remove(held)

    def _compact(self) -> None:
        # Messages released by ID (or forgotten) stay in the key queue until a
        # claim passes their key; rebuild it if they ever outnumber the live ones.
        if len(self._by_key) > 2 * len(self._held) + 1024:
            self._by_key = MinQueue((h.key, h.serial, h) for h in self._held.values())
        if len(self._by_order) > 2 * len(self._held) + 1024:
            self._by_order = MinQueue((h.order, h.serial, h) for h in self._held.values())


class ClaimSortNode:
    """The cluster's claim-mode sort node: uplink messages bake in a :class:`ClaimCache`.

    The worker of an active-active pair bakes every message it reads from the
    uplink; the master escalates each message it processed (ID, key, uplink
    position). A claim releases every baked message at or below the claimed
    key to ``bypass``; a message whose ID is already known to be processed
    (``offer(processed=True)``) is never baked. A message that stays unclaimed
    for ``bake_time`` seconds means the master fell behind or died: :meth:`tick`
    returns it for ``unclaimed_outlink`` (``done`` by default, as QFlow's
    documentation says; ``failure`` as QFlow's code did) so it is surfaced, but the node
    keeps it, because routing it out must never make it unrecoverable: it
    stays eligible for :meth:`rollback` until a claim or :meth:`release_upto` proves
    it was processed.

    Claims and uplink order. Claiming "every message at or below the key" is
    only safe when the master has processed all of them, which holds when keys
    grow in uplink order. A claim therefore also carries the uplink position of
    the claiming message and releases only baked messages at or before it; a
    message with a lower key that sits later in the uplink waits for its own
    claim (the master escalates every message) instead of being lost on failover.

    Nothing here reads a clock or touches a server: callers pass ``now`` and
    call :meth:`tick` at :meth:`next_deadline`.

    >>> from twinflow.runtime.message import Message
    >>> node = ClaimSortNode(bake_time=5.0)
    >>> node.offer(Message("a", 1, "10-0", b"{}"), now=0.0) is None  # baked
    True
    >>> [m.id for m in node.claim("a", 1, "10-0")]
    ['a']
    """

    def __init__(self, bake_time: float, unclaimed_outlink: str = DONE, max_pending: int = 1_000_000):
        if bake_time <= 0:
            raise ValueError("bake_time must be > 0 in claim mode")
        if unclaimed_outlink not in (DONE, FAILURE):
            raise ValueError("unclaimed_outlink must be 'done' or 'failure'")
        self.bake_time = bake_time
        self.unclaimed_outlink = unclaimed_outlink
        self.max_pending = max_pending
        self._cache = ClaimCache()

    # -- state ------------------------------------------------------------
    @property
    def baked(self) -> int:
        """Messages still baking."""
        return self._cache.baking

    @property
    def pending(self) -> int:
        """Messages the node holds (baking or overdue): what a rollback would return."""
        return len(self._cache)

    @property
    def full(self) -> bool:
        """True at max_pending: the caller must stop reading (backpressure), not drop."""
        return self.pending >= self.max_pending

    @property
    def claimed(self) -> int:
        """Released to bypass: by a claim or the processed mark while baking, or as already processed."""
        return self._cache.claimed

    @property
    def unclaimed(self) -> int:
        """Routed to unclaimed_outlink after baking fully."""
        return self._cache.unclaimed

    @property
    def rolled_back(self) -> int:
        """Handed back for processing by rollback()."""
        return self._cache.rolled_back

    def next_deadline(self) -> float | None:
        """When the oldest baking message is fully baked, or None."""
        return self._cache.next_deadline()

    # -- input ------------------------------------------------------------
    def offer(self, msg: Message, now: float, processed: bool = False) -> str | None:
        """Take one uplink message. Returns the outlink it left by, or None if baked.

        ``processed`` says its ID is already in the ID cache: it is not baked.
        The same uplink entry read again (a replayed batch) is not baked twice.
        """
        return self._cache.offer(msg, msg.id, msg.key, position_order(msg.position),
                                 now + self.bake_time, processed)

    def claim(self, msg_id: str, key: Any, position: str) -> list[Message]:
        """Release (to bypass) the message ``msg_id`` and every message at or
        below ``key`` that sits at or before ``position`` in the uplink."""
        return self._cache.claim(msg_id, key, position_order(position))

    def take_claims(self, claims: list[tuple[str, Any, str]]) -> list:
        """What the claims (id, key, position) would release, still held: prove each
        message processed, then :meth:`settle_claims` (a claim is a hint, not the record)."""
        take = self._cache.take
        return [t for mid, key, pos in claims for t in take(mid, key, position_order(pos))]

    @staticmethod
    def claimed_messages(taken: list) -> list[Message]:
        """The messages :meth:`take_claims` took, in the same order."""
        return [held.item for held, _ in taken]

    def settle_claims(self, taken: list, proven: list[bool]) -> list[Message]:
        """Release to bypass the taken messages proven processed; the others bake on."""
        return self._cache.settle(taken, proven)

    def tick(self, now: float) -> list[Message]:
        """Route every fully baked message to the unclaimed outlink; they stay recoverable."""
        return self._cache.expire(now)

    def release_upto(self, position: str) -> int:
        """Drop every message at or before ``position``: the flow's processed mark proves
        the masters processed all of them. Baking ones leave through bypass. Returns how many."""
        return self._cache.release_upto(position_order(position))

    def rollback(self) -> list[Message]:
        """Every unclaimed message (baking and overdue), in uplink order; the node is empty after."""
        return self._cache.rollback()
