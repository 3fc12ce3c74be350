"""The claim logic, once: messages bake until the master claims them (QFlow's claim mode).

:class:`ClaimCache` is what both claim-mode users hold: the sort node's
claim rulesets (replay) and :class:`ClaimSortNode`, the worker's
half of a cluster's claim pair. Nothing here reads a clock or touches a
server.
"""

from __future__ import annotations

from collections.abc import Mapping
from operator import attrgetter
from typing import TYPE_CHECKING, Any

from ...positions import position_order
from .min_queue import MinQueue

if TYPE_CHECKING:
    from ...message import Message

DONE, BYPASS, FAILURE, NOHIT = "done", "bypass", "failure", "nohit"
ALL = "all"  # the one baking ruleset of the claim pair's short form (pairs_with, key, bake_time)


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

    def __init__(self, track_resolved: bool = False):
        self._held: dict[Any, _Held] = {}           # order -> held message (baking or overdue)
        self._by_id: dict[str, list[_Held]] = {}
        self._by_key = MinQueue()                  # (key, serial, held); left ones are skipped
        self._by_ready = MinQueue()                # (ready_at, serial, held) of baking ones
        self._by_order = MinQueue()                # (order, serial, held); left ones are skipped
        self._serial = 0                            # breaks ties so held objects are never compared
        self.baking = 0
        # Each message's one exit is counted once: claimed (a claim, the mark, or processed before
        # it was baked) or rolled back. Being reported overdue is a notice, not an exit.
        self.claimed = 0      # released by a claim or the mark (overdue or not), or never baked (processed)
        self.unclaimed = 0    # reported overdue by expire(): notices, each message at most once
        self.rolled_back = 0  # returned by rollback()
        # With track_resolved: (item, "claimed" | "rolled_back") of each message reported overdue that
        # has left since, so that whoever published the notice can publish how it ended.
        self._resolved: list[tuple[Any, str]] | None = [] if track_resolved else None

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
                if held.overdue and self._resolved is not None:
                    self._resolved.append((held.item, "claimed"))
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

        Each counts as claimed (an overdue one too: its report was a notice).
        Costs O(log n) per released message, whatever the cache holds.
        """
        n = 0
        for _, _, held in self._by_order.pop_upto(upto):
            if held.live:
                if held.overdue and self._resolved is not None:
                    self._resolved.append((held.item, "claimed"))
                self._drop(held)
                n += 1
        self.claimed += n
        self._compact()
        return n

    def rollback(self) -> list:
        """Every held item (baking and overdue) in uplink order; the cache is empty after."""
        held = sorted(self._held.values(), key=_ORDER)
        out = [h.item for h in held]
        if self._resolved is not None:
            self._resolved.extend((h.item, "rolled_back") for h in held if h.overdue)
        for h in held:
            h.live = False
        self._held.clear()
        self._by_id.clear()
        self._by_key = MinQueue()
        self._by_ready = MinQueue()
        self._by_order = MinQueue()
        self.baking = 0
        self.rolled_back += len(out)
        return out

    def item_at(self, order: Any) -> Any:
        """The item held at uplink ``order``, or None."""
        held = self._held.get(order)
        return None if held is None else held.item

    def drain_resolved(self) -> list[tuple[Any, str]]:
        """With ``track_resolved``: the messages reported overdue that have left since the last
        call, each with how (``"claimed"`` or ``"rolled_back"``); empty otherwise."""
        out, self._resolved = self._resolved or [], [] if self._resolved is not None else None
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
    """The cluster's claim-mode sort node: uplink messages bake in one :class:`ClaimCache` per
    baking ruleset (``claim_rules.ClaimRules``), until the master's escalation claims them.

    The worker of an active-active pair bakes every uplink message its ruleset holds; the
    master escalates, for each message it processed, a claim: the ruleset, the claim ID and
    the key as that ruleset builds them, and the message's uplink position. A claim releases,
    in its ruleset's group only, the message with the claimed ID and every baked message at
    or below the claimed key (a claim ruleset's claim, or one that names no ruleset, in every
    group, as replay's one cache does); a message whose ID is already known to be processed
    (``offer(processed=True)``) is never baked. A message that no baking ruleset takes leaves
    at once: through ``nohit`` (no ruleset, or a claim ruleset, whose messages are claims).
    A message that stays unclaimed for its ruleset's ``bake_time`` means the master fell
    behind or died: :meth:`tick` reports it for ``unclaimed_outlink`` (``done`` by default,
    as QFlow's documentation says; ``failure`` as QFlow's code did), but the node keeps it,
    because routing it out must never make it unrecoverable: it stays eligible for
    :meth:`rollback` until a claim or :meth:`release_upto` proves it was processed. That
    report is a notice; each message's one exit is its claim (bypass), its rollback, nohit or
    failure, and :meth:`resolved` says how each reported message ended.

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
    >>> node.offer(Message("a", 1, "10-0", b"{}", rule="all", cid="a"), now=0.0) is None  # baked
    True
    >>> [m.id for m in node.claim("a", 1, "10-0", "all")]
    ['a']
    """

    def __init__(self, bake_time: float | Mapping[str, float], unclaimed_outlink: str = DONE,
                 max_pending: int = 1_000_000):
        bake_times = {ALL: bake_time} if isinstance(bake_time, (int, float)) else dict(bake_time)
        if not bake_times or any(t <= 0 for t in bake_times.values()):
            raise ValueError("bake_time must be > 0 in claim mode, for every baking ruleset")
        if unclaimed_outlink not in (DONE, FAILURE):
            raise ValueError("unclaimed_outlink must be 'done' or 'failure'")
        self.bake_times = bake_times
        self.unclaimed_outlink = unclaimed_outlink
        self.max_pending = max_pending
        self._caches = {name: ClaimCache(track_resolved=True) for name in bake_times}
        self._all = tuple(self._caches.values())
        self.nohit = 0  # messages no baking ruleset takes: left at once

    # -- state ------------------------------------------------------------
    @property
    def baked(self) -> int:
        """Messages still baking."""
        return sum(c.baking for c in self._all)

    @property
    def pending(self) -> int:
        """Messages the node holds (baking or overdue): what a rollback would return."""
        return sum(len(c) for c in self._all)

    def rule_pending(self) -> dict[str, int]:
        """RULE_PEND: how many messages each baking ruleset holds (``nohit`` never holds any)."""
        counts = {name: len(c) for name, c in self._caches.items()}
        counts[NOHIT] = 0
        return counts

    def pending_counts(self) -> dict[str, Any]:
        """What the node holds, as a flow node's ``pending_counts``: ``held``, of them ``baking`` and
        ``overdue`` (baked fully, unclaimed, still held), and the same per baking ruleset."""
        rulesets = {name: {"baking": c.baking, "overdue": len(c) - c.baking} for name, c in self._caches.items()}
        baking = sum(r["baking"] for r in rulesets.values())
        overdue = sum(r["overdue"] for r in rulesets.values())
        return {"held": baking + overdue, "baking": baking, "overdue": overdue, "rulesets": rulesets}

    @property
    def full(self) -> bool:
        """True at max_pending: the caller must stop reading (backpressure), not drop."""
        return self.pending >= self.max_pending

    @property
    def claimed(self) -> int:
        """Released to bypass: by a claim or the processed mark, or as already processed."""
        return sum(c.claimed for c in self._all)

    @property
    def unclaimed(self) -> int:
        """Reported to unclaimed_outlink after baking fully (notices: each message at most once)."""
        return sum(c.unclaimed for c in self._all)

    @property
    def rolled_back(self) -> int:
        """Handed back for processing by rollback()."""
        return sum(c.rolled_back for c in self._all)

    def next_deadline(self) -> float | None:
        """When the oldest baking message is fully baked, or None."""
        deadlines = [d for d in (c.next_deadline() for c in self._all) if d is not None]
        return min(deadlines) if deadlines else None

    # -- input ------------------------------------------------------------
    def offer(self, msg: Message, now: float, processed: bool = False) -> str | None:
        """Take one uplink message. Returns the outlink it left by, or None if baked.

        ``processed`` says its ID is already in the ID cache: it is not baked.
        The same uplink entry read again (a replayed batch) is not baked twice.
        """
        cache = self._caches.get(msg.rule)
        if cache is None:
            self.nohit += 1
            return NOHIT
        return cache.offer(msg, msg.cid, msg.key, position_order(msg.position),
                           now + self.bake_times[msg.rule], processed)

    def claim(self, claim_id: str, key: Any, position: str, rule: str = "") -> list[Message]:
        """Release (to bypass) the message ``claim_id`` and every message at or below ``key``
        that sits at or before ``position`` in the uplink, in ``rule``'s group."""
        taken = self.take_claims([(claim_id, key, position, rule)])
        return self.settle_claims(taken, [True] * len(taken))

    def take_claims(self, claims: list[tuple[str, Any, str, str]]) -> list:
        """What the claims (ID, key, position, ruleset) would release, still held: prove each
        message processed, then :meth:`settle_claims` (a claim is a hint, not the record)."""
        taken = []
        for cid, key, pos, rule in claims:
            order = position_order(pos)
            cache = self._caches.get(rule)
            for c in (cache,) if cache is not None else self._all:
                taken.extend((c, held, flag) for held, flag in c.take(cid, key, order))
        return taken

    @staticmethod
    def claimed_messages(taken: list) -> list[Message]:
        """The messages :meth:`take_claims` took, in the same order."""
        return [held.item for _, held, _ in taken]

    def settle_claims(self, taken: list, proven: list[bool]) -> list[Message]:
        """Release to bypass the taken messages proven processed; the others bake on."""
        by_cache: dict[int, tuple[ClaimCache, list, list]] = {}
        for (cache, held, flag), ok in zip(taken, proven):
            _, items, oks = by_cache.setdefault(id(cache), (cache, [], []))
            items.append((held, flag))
            oks.append(ok)
        released = [m for cache, items, oks in by_cache.values() for m in cache.settle(items, oks)]
        if len(by_cache) > 1:
            released.sort(key=lambda m: position_order(m.position))
        return released

    def tick(self, now: float) -> list[Message]:
        """Report every fully baked message for the unclaimed outlink; they stay recoverable."""
        return [m for c in self._all for m in c.expire(now)]

    def held_at(self, position: str) -> Message | None:
        """The message held from uplink ``position``, or None: what a claim of it left behind
        (the simulator checks that a proven claim never does)."""
        order = position_order(position)
        for c in self._all:
            item = c.item_at(order)
            if item is not None:
                return item
        return None

    def resolved(self) -> list[tuple[Message, str]]:
        """The reported (overdue) messages that left since the last call, each with how:
        ``"claimed"`` (the master did process it) or ``"rolled_back"`` (handed back)."""
        return [r for c in self._all for r in c.drain_resolved()]

    def release_upto(self, position: str) -> int:
        """Drop every message at or before ``position``: the flow's processed mark proves
        the masters processed all of them. Baking ones leave through bypass. Returns how many."""
        order = position_order(position)
        return sum(c.release_upto(order) for c in self._all)

    def rollback(self) -> list[Message]:
        """Every unclaimed message (baking and overdue), in uplink order; the node is empty after."""
        out = [m for c in self._all for m in c.rollback()]
        if len(self._all) > 1:
            out.sort(key=lambda m: position_order(m.position))
        return out
