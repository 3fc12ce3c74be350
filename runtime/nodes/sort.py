"""The Sort node: each ruleset's messages leave in key order, as far as its mode promises (seed 002).

Rulesets sort messages into groups: the first ruleset whose ``match`` the
message meets takes it (a ruleset without ``match`` takes every message), and
its ``key`` template gives the sort key, read as the node's ``key_type``. A
message no ruleset takes leaves at once through ``nohit`` (the implicit
``nohit`` ruleset). Each ruleset has its own mode, from ``bake_time`` and
``session_timeout`` (both in seconds):

- static (both 0): nothing is held. A message whose key is above every key
  before it in its ruleset (the first ascending series) leaves through
  ``done``; any other through ``bypass``. ``done`` is strictly ascending.
- session (``bake_time`` 0, ``session_timeout`` > 0): every message is held;
  once the ruleset's cache has not changed for ``session_timeout``, all of
  it leaves through ``done`` in key order. ``done`` ascends within a session.
- bake (``bake_time`` > 0): a message at or below the threshold (the highest
  key the ruleset has flushed) leaves through ``bypass`` at once; others
  bake. The reference message is the longest-baked one; ``bake_time`` after
  it arrived, the highest key among the fully baked messages becomes the
  threshold, every held message at or below it leaves through ``done`` in
  key order, and the longest-baked message left is the next reference.
  ``done`` ascends across sessions (equal keys may repeat).

Claim mode (any ruleset has ``type: claim``; the worker of an active-active
pair). Other rulesets bake until claimed. A message of a claim ruleset is an
escalation from the master: its ID enters the node's ID cache (kept
``id_ttl`` seconds), every held message at or below its key, or with its ID,
leaves through ``bypass`` (in arrival order), and the claiming message
itself through ``nohit``. A message whose ID is in the ID cache is never
baked: it leaves through ``bypass`` at once. A message unclaimed after its
``bake_time`` is surfaced through ``unclaimed_outlink`` (``done``, or
``failure``) yet stays held; a message matching ``rollback_on`` rolls every
held message back through ``rollback`` in arrival order (then leaves
through ``nohit`` itself). See :class:`ClaimCache` and :class:`ClaimSortNode`
(the cluster's claim node, built on the same cache).

Bad input: a message whose key (or, in claim mode, ID) field is missing or
of the wrong type leaves through ``failure`` with ``info["reason"]`` and
changes nothing. Every message leaves exactly once, through ``done``,
``bypass``, ``nohit``, ``failure`` or ``rollback``; in claim mode the
surfacing of an unclaimed message is a notice and its one exit is still to
come (a claim, or a rollback). ``now`` must not decrease between calls.

>>> from twinflow.runtime.params import Doc, Params
>>> doc = Doc("rulesets:\\n- {name: all, key: '{seq}', bake_time: 2}\\n", "f.yaml")
>>> node = build("sorter", Params(doc, "", doc.value))
>>> for t, n in [(0.0, 5), (0.5, 7), (1.0, 3)]:
...     _ = node.on_message(Msg(f"m{n}", {"seq": n}), now=t)
>>> [(e.outlink, e.msgs[0].id) for e in node.on_time(2.0)]
[('done', 'm3'), ('done', 'm5')]
>>> node.rule_pending()
{'all': 1, 'nohit': 0}
"""

from __future__ import annotations

import heapq
import re
from collections import deque
from dataclasses import dataclass
from functools import partial
from operator import attrgetter
from types import MappingProxyType
from typing import Any, Iterable

from ..fields import BadInput, FieldPath, MissingField, Template
from ..keys import KEY_TYPES as KEY_NAMES, parse_key
from ..message import Message, position_order
from ..params import Params
from .base import Emit, Msg, Node, msg_from_json, msg_json

DONE, BYPASS, FAILURE, NOHIT, ROLLBACK = "done", "bypass", "failure", "nohit", "rollback"
OUTLINKS = (DONE, BYPASS, FAILURE, NOHIT, ROLLBACK)  # the seed's four, in its order, then ours
_NO_INFO: Any = MappingProxyType({})
_UNCLAIMED_INFO: Any = MappingProxyType({"reason": "not claimed within bake_time; held until claimed or rolled back"})


class _MinQueue:
    """A priority queue of tuples that costs O(1) while items arrive in order.

    Keys and bake deadlines mostly grow: those items go to a sorted run (a
    deque); only an item below the run's tail pays for the heap. The smallest
    item is the smaller of the two fronts.
    """

    __slots__ = ("_run", "_heap")

    def __init__(self, items: Iterable[tuple] = ()):
        self._run = deque(sorted(items))
        self._heap: list[tuple] = []

    def __len__(self) -> int:
        return len(self._run) + len(self._heap)

    def push(self, item: tuple) -> None:
        run = self._run
        if not run or item >= run[-1]:
            run.append(item)
        else:
            heapq.heappush(self._heap, item)

    def peek(self) -> tuple:
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heap[0]
        return run[0]

    def pop(self) -> tuple:
        run, heap = self._run, self._heap
        if heap and (not run or heap[0] < run[0]):
            return heapq.heappop(heap)
        return run.popleft()

    def items(self) -> list[tuple]:
        """Every item, in no particular order."""
        return [*self._run, *self._heap]

    def pop_upto(self, limit: Any) -> list[tuple]:
        """Remove and return, smallest first, every item whose first field is at or below ``limit``."""
        out = []
        run, heap = self._run, self._heap
        while True:
            if heap and (not run or heap[0] < run[0]):
                if heap[0][0] > limit:
                    return out
                out.append(heapq.heappop(heap))
            elif run and run[0][0] <= limit:
                out.append(run.popleft())
            else:
                return out


# -- the claim logic both sort nodes share --------------------------------------------------------
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
        self._by_key = _MinQueue()                  # (key, serial, held); left ones are skipped
        self._by_ready = _MinQueue()                # (ready_at, serial, held) of baking ones
        self._by_order = _MinQueue()                # (order, serial, held); left ones are skipped
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
        taken = []
        queue = self._by_key
        for entry in queue.pop_upto(key):
            held = entry[2]
            if not held.live:
                continue
            if held.order > upto:
                queue.push(entry)  # later in the uplink than the claim: not proven processed
            else:
                taken.append(held)
        for held in self._by_id.get(ident, ()):
            if held.key > key or held.order > upto:  # not taken above: its ID proves it processed
                taken.append(held)
        released = sorted(taken, key=_ORDER)
        for held in released:
            self._drop(held)
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
        self._by_key = _MinQueue()
        self._by_ready = _MinQueue()
        self._by_order = _MinQueue()
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
            self._by_key = _MinQueue((h.key, h.serial, h) for h in self._held.values())
        if len(self._by_order) > 2 * len(self._held) + 1024:
            self._by_order = _MinQueue((h.order, h.serial, h) for h in self._held.values())


class ClaimSortNode:
    """The cluster's claim-mode sort node: uplink messages bake in a :class:`ClaimCache`.

    The worker of an active-active pair bakes every message it reads from the
    uplink; the master escalates each message it processed (ID, key, uplink
    position). A claim releases every baked message at or below the claimed
    key to ``bypass``; a message whose ID is already known to be processed
    (``offer(processed=True)``) is never baked. A message that stays unclaimed
    for ``bake_time`` seconds means the master fell behind or died: :meth:`tick`
    returns it for ``unclaimed_outlink`` (``done`` by default, as the seed's
    text says; ``failure`` as QFlow's code did) so it is surfaced, but the node
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


# -- reading messages -----------------------------------------------------------------------------
KEY_TYPES = {name: partial(parse_key, name) for name in KEY_NAMES}


def _ident(v: Any) -> str:
    if isinstance(v, (str, int, float)) and not isinstance(v, bool) and v != "":
        return str(v)
    raise BadInput(f"ID {v!r} is not a non-empty string or number")


@dataclass(frozen=True)
class Pattern:
    """Which messages a ruleset takes: the value at ``field`` equals ``equals``,
    or (with ``regex``) is a string in which the regular expression is found."""

    field: FieldPath
    equals: Any = None
    regex: re.Pattern | None = None

    def matches(self, doc: Any) -> bool:
        try:
            v = self.field.get(doc)
        except MissingField:
            return False
        if self.regex is not None:
            return isinstance(v, str) and self.regex.search(v) is not None
        # YAML's `equals: 1` must not take a JSON `true` (Python says True == 1).
        return v == self.equals and isinstance(v, bool) == isinstance(self.equals, bool)


@dataclass(frozen=True)
class Ruleset:
    """One ruleset as the flow file gives it (see the module docstring and docs/nodes/sort.md)."""

    name: str
    key: Template
    match: Pattern | None = None          # None: every message
    type: str = "sort"                    # "sort", or "claim" (claim mode)
    bake_time: float = 0.0                # seconds
    session_timeout: float = 0.0          # seconds
    id: Template | None = None            # claim mode: the message's ID; default the key


# -- one ruleset's behaviour per mode -------------------------------------------------------------
class _Rule:
    """What every ruleset's behaviour has: its spec, read once, and how many messages it holds."""

    held = 0

    def __init__(self, spec: Ruleset):
        self.spec, self.match, self.key = spec, spec.match, spec.key


class _Static(_Rule):
    """The first ascending series leaves through done, the rest through bypass."""

    _last: Any = None

    def dump(self) -> dict | None:
        return None if self._last is None else {"last": self._last}

    def load(self, entry: dict) -> None:
        self._last = entry["last"]

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        if self._last is None or key > self._last:
            self._last = key
            return [Emit(DONE, (msg,), _NO_INFO)]
        return [Emit(BYPASS, (msg,), _NO_INFO)]


class _Session(_Rule):
    """Holds everything; flushes in key order once the cache is quiet for session_timeout."""

    def __init__(self, spec: Ruleset):
        super().__init__(spec)
        self._timeout = spec.session_timeout
        # Two flat lists, not a tuple per message: a big session would otherwise
        # hand the garbage collector one more object to trace per message.
        self._keys: list[Any] = []
        self._msgs: list[Msg] = []
        self._changed = 0.0

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        self._keys.append(key)
        self._msgs.append(msg)
        self._changed = now
        self.held += 1
        return []

    def deadline(self) -> float | None:
        return self._changed + self._timeout if self._msgs else None

    def dump(self) -> dict | None:
        return {"keys": self._keys, "msgs": [msg_json(m) for m in self._msgs], "changed": self._changed} \
            if self._msgs else None

    def load(self, entry: dict) -> None:
        self._keys, self._msgs = list(entry["keys"]), [msg_from_json(m) for m in entry["msgs"]]
        self._changed, self.held = entry["changed"], len(self._msgs)

    def fire(self, at: float) -> list[Emit]:
        keys, msgs = self._keys, self._msgs
        self._keys, self._msgs, self.held = [], [], 0
        # A stable sort: equal keys keep their arrival order.
        return [Emit(DONE, (msgs[i],), _NO_INFO) for i in sorted(range(len(keys)), key=keys.__getitem__)]


class _Bake(_Rule):
    """The seed's reference-message bake, with the threshold carried from session to session."""

    def __init__(self, spec: Ruleset):
        super().__init__(spec)
        self._bake_time = spec.bake_time
        self._threshold: Any = None                          # highest key flushed so far
        self._keys = _MinQueue()                             # (key, arrival number, message)
        self._arrivals: deque[tuple[float, Any]] = deque()   # (arrival time, key); front: the reference
        self._seq = 0

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        if self._threshold is not None and key <= self._threshold:
            return [Emit(BYPASS, (msg,), _NO_INFO)]  # too late to be ordered among what has left
        self._seq += 1
        self._keys.push((key, self._seq, msg))
        self._arrivals.append((now, key))
        self.held += 1
        return []

    def deadline(self) -> float | None:
        arrivals = self._arrivals
        return arrivals[0][0] + self._bake_time if arrivals else None

    def dump(self) -> dict | None:
        if self._threshold is None and not self.held:
            return None
        held = sorted(self._keys.items())
        return {"threshold": self._threshold, "seq": self._seq, "arrivals": list(self._arrivals),
                "held": [[key, n, msg_json(m)] for key, n, m in held]}

    def load(self, entry: dict) -> None:
        self._threshold, self._seq = entry["threshold"], entry["seq"]
        self._arrivals = deque((t, key) for t, key in entry["arrivals"])
        self._keys = _MinQueue((key, n, msg_from_json(m)) for key, n, m in entry["held"])
        self.held = len(entry["held"])

    def fire(self, at: float) -> list[Emit]:
        # Fully baked when the reference is: the messages that arrived with it
        # (nothing held arrived before it). Arrivals flushed earlier may still
        # sit among them; their keys are below the reference's, so the
        # maximum ignores them.
        arrivals = self._arrivals
        ref_arrival, top = arrivals[0]
        for arrived, key in arrivals:
            if arrived > ref_arrival:
                break
            if key > top:
                top = key
        self._threshold = top
        out = [Emit(DONE, (msg,), _NO_INFO) for _, _, msg in self._keys.pop_upto(top)]
        self.held -= len(out)
        while arrivals and arrivals[0][1] <= top:
            arrivals.popleft()
        return out


class _IdCache:
    """IDs the master processed, each kept ``ttl`` seconds after it was last claimed."""

    def __init__(self, ttl: float):
        self.ttl = ttl
        self._until: dict[str, float] = {}
        self._queue: deque[tuple[float, str]] = deque()  # (expiry, ID) in expiry order

    def __len__(self) -> int:
        return len(self._until)

    def add(self, ident: str, now: float) -> None:
        until = now + self.ttl
        self._until[ident] = until
        self._queue.append((until, ident))

    def has(self, ident: str, now: float) -> bool:
        until = self._until.get(ident)
        return until is not None and until > now

    def expire(self, now: float) -> None:
        queue, until = self._queue, self._until
        while queue and queue[0][0] <= now:
            t, ident = queue.popleft()
            if until.get(ident) == t:  # not claimed again since
                del until[ident]


class _Claims:
    """Claim mode: the held messages of every sort ruleset in one ClaimCache, plus the ID cache."""

    def __init__(self, id_ttl: float, unclaimed_outlink: str):
        self.cache = ClaimCache()
        self.ids = _IdCache(id_ttl)
        self.unclaimed_outlink = unclaimed_outlink
        self._seq = 0  # arrival number: the uplink order of this node's input

    def bake(self, rule: "_ClaimBake", msg: Msg, key: Any, ident: str, now: float) -> list[Emit]:
        self.ids.expire(now)
        self._seq += 1
        processed = self.ids.has(ident, now)
        if self.cache.offer((rule, msg), ident, key, self._seq, now + rule.spec.bake_time, processed):
            return [Emit(BYPASS, (msg,), _NO_INFO)]
        rule.held += 1
        return []

    def claim(self, msg: Msg, key: Any, ident: str, now: float) -> list[Emit]:
        self.ids.expire(now)
        self.ids.add(ident, now)
        self._seq += 1  # everything held arrived before this claim, so all of it may be claimed
        out = self._leave(BYPASS, self.cache.claim(ident, key, upto=self._seq))
        out.append(Emit(NOHIT, (msg,), _NO_INFO))
        return out

    def rollback(self) -> list[Emit]:
        return self._leave(ROLLBACK, self.cache.rollback())

    def deadline(self) -> float | None:
        return self.cache.next_deadline()

    def fire(self, at: float) -> list[Emit]:
        return [Emit(self.unclaimed_outlink, (msg,), _UNCLAIMED_INFO) for _, msg in self.cache.expire(at)]

    def _leave(self, outlink: str, items: list) -> list[Emit]:
        out = []
        for rule, msg in items:
            rule.held -= 1
            out.append(Emit(outlink, (msg,), _NO_INFO))
        return out


class _ClaimBake(_Rule):
    """A sort ruleset in claim mode: bakes until claimed (never, if already processed)."""

    def __init__(self, spec: Ruleset, claims: _Claims):
        super().__init__(spec)
        self._claims = claims

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        return self._claims.bake(self, msg, key, ident, now)


class _Claiming(_Rule):
    """A claim ruleset: each message is an escalation that claims what the master processed."""

    def __init__(self, spec: Ruleset, claims: _Claims):
        super().__init__(spec)
        self._claims = claims

    def take(self, msg: Msg, key: Any, ident: str | None, now: float) -> list[Emit]:
        return self._claims.claim(msg, key, ident, now)


# -- the node -------------------------------------------------------------------------------------
class SortNode(Node):
    """The flow-file sort node (kind ``sort``); see the module docstring. Build it with :func:`build`."""

    kind = "sort"
    outlinks = OUTLINKS

    def __init__(self, name: str, rulesets: list[Ruleset], *, key_type: str = "int", id_ttl: float = 86400.0,
                 unclaimed_outlink: str = DONE, rollback_on: Pattern | None = None, max_pending: int = 1_000_000):
        super().__init__(name)
        self.max_pending = max_pending
        self._parse_key = KEY_TYPES[key_type]
        self._rollback_on = rollback_on
        claim_mode = any(r.type == "claim" for r in rulesets)
        if rollback_on is not None and not claim_mode:
            raise ValueError("rollback_on needs claim mode (a ruleset of type claim)")
        self._claims = _Claims(id_ttl, unclaimed_outlink) if claim_mode else None
        self._rules = [self._behaviour(r) for r in rulesets]
        timed = [r for r in self._rules if isinstance(r, (_Session, _Bake))]
        self._timers: list = [self._claims] if claim_mode else timed
        # State per ruleset (see base); claim mode keeps its cache in this process only.
        self.state_in_redis = not claim_mode
        self._by_name = {rule.spec.name: rule for rule in self._rules}
        self._changed: set[str] = set()
        # The earliest deadline as (timer, time), or None when something changed
        # since it was found: the engine asks for it before every message.
        self._due: tuple[Any, float | None] | None = None

    def _behaviour(self, spec: Ruleset):
        if self._claims is not None:
            return (_Claiming if spec.type == "claim" else _ClaimBake)(spec, self._claims)
        if spec.bake_time > 0:
            return _Bake(spec)
        if spec.session_timeout > 0:
            return _Session(spec)
        return _Static(spec)

    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        self._due = None
        doc = msg.doc
        if self._rollback_on is not None and self._rollback_on.matches(doc):
            out = self._claims.rollback()
            out.append(Emit(NOHIT, (msg,), _NO_INFO))
            return out
        for rule in self._rules:
            if rule.match is None or rule.match.matches(doc):
                break
        else:
            return [Emit(NOHIT, (msg,), _NO_INFO)]
        try:
            key = self._parse_key(rule.key.render(doc))
            ident = None if self._claims is None else self._ident(rule.spec, doc, key)
        except BadInput as exc:
            return [Emit(FAILURE, (msg,), {"reason": str(exc)})]
        self._changed.add(rule.spec.name)
        return rule.take(msg, key, ident, now)

    def changed_state(self) -> dict:
        if self._claims is not None:
            return {}
        changed, self._changed = self._changed, set()
        return {name: self._by_name[name].dump() for name in changed}

    def load_state(self, entries) -> None:
        for name, entry in entries.items():
            self._by_name[name].load(entry)
        self._due = None

    @staticmethod
    def _ident(spec: Ruleset, doc: Any, key: Any) -> str:
        return _ident(key if spec.id is None else spec.id.render(doc))  # the seed: no IDTemplate, ID = key

    def on_time(self, now: float) -> list[Emit]:
        out: list[Emit] = []
        while True:
            timer, at = self._earliest()
            if timer is None or at > now:
                return out
            out += timer.fire(at)
            if timer is not self._claims:
                self._changed.add(timer.spec.name)
            self._due = None

    def next_deadline(self) -> float | None:
        return self._earliest()[1]

    def _earliest(self) -> tuple[Any, float | None]:
        if self._due is None:
            best, best_at = None, None
            for timer in self._timers:  # one per ruleset at most: never a scan of the held messages
                at = timer.deadline()
                if at is not None and (best is None or at < best_at):
                    best, best_at = timer, at
            self._due = (best, best_at)
        return self._due

    def pending(self) -> int:
        return sum(rule.held for rule in self._rules)

    def rule_pending(self) -> dict[str, int]:
        """RULE_PEND: how many messages each ruleset holds (``nohit`` never holds any)."""
        counts = {rule.spec.name: rule.held for rule in self._rules}
        counts[NOHIT] = 0
        return counts

    @property
    def full(self) -> bool:
        """True at max_pending: an engine should stop reading (backpressure); the node never drops."""
        return self.pending() >= self.max_pending


# -- the flow file --------------------------------------------------------------------------------
def build(name: str, p: Params) -> SortNode:
    p.only("rulesets", "key_type", "id_ttl", "unclaimed_outlink", "rollback_on", "max_pending")
    key_type = p.choice("key_type", KEY_TYPES, "int")
    sections = p.sections("rulesets")
    if not sections:
        raise p.error("rulesets", "must list at least one ruleset")
    rulesets: list[Ruleset] = []
    for r in sections:
        spec = _read_ruleset(r)
        if any(s.name == spec.name for s in rulesets):
            raise r.error("name", f"another ruleset is already named {spec.name!r}")
        rulesets.append(spec)
    claim_mode = any(s.type == "claim" for s in rulesets)
    for r, spec in zip(sections, rulesets):
        _check_mode(r, spec, claim_mode)
    if claim_mode and all(s.type == "claim" for s in rulesets):
        raise p.error("rulesets", "claim mode needs a ruleset of type sort (the messages that claims release)")
    if not claim_mode:
        for field in ("id_ttl", "unclaimed_outlink", "rollback_on"):
            if p.has(field):
                raise p.error(field, "only in claim mode (a ruleset with type: claim)")
    return SortNode(
        name, rulesets, key_type=key_type,
        id_ttl=p.seconds("id_ttl", 86400.0, positive=True),
        unclaimed_outlink=p.choice("unclaimed_outlink", (DONE, FAILURE), DONE),
        rollback_on=_read_pattern(p.section("rollback_on")) if p.has("rollback_on") else None,
        max_pending=p.integer("max_pending", 1_000_000, minimum=1),
    )


def _read_ruleset(r: Params) -> Ruleset:
    r.only("name", "match", "key", "type", "bake_time", "session_timeout", "id")
    name = r.name("name")
    if name == NOHIT:
        raise r.error("name", "'nohit' is the implicit ruleset of the messages no ruleset takes")
    return Ruleset(
        name=name,
        key=r.template("key"),
        match=_read_pattern(r.section("match")) if r.has("match") else None,
        type=r.choice("type", ("sort", "claim"), "sort"),
        bake_time=r.seconds("bake_time", 0.0),
        session_timeout=r.seconds("session_timeout", 0.0),
        id=r.template("id", None),
    )


def _check_mode(r: Params, spec: Ruleset, claim_mode: bool) -> None:
    """Refuse what a ruleset's mode would silently ignore."""
    if spec.type == "claim":
        for field in ("bake_time", "session_timeout"):
            if r.has(field):
                raise r.error(field, "has no meaning on a claim ruleset")
    elif claim_mode:
        if spec.bake_time <= 0:
            raise r.error("bake_time", "claim mode needs bake_time > 0 on every sort ruleset "
                                       "(how long a message waits for its claim)")
        if r.has("session_timeout"):
            raise r.error("session_timeout", "has no meaning in claim mode")
    else:
        if spec.id is not None:
            raise r.error("id", "only in claim mode (a ruleset with type: claim)")
        if spec.bake_time > 0 and spec.session_timeout > 0:
            raise r.error("session_timeout", "has no effect when bake_time > 0; set one of the two")


def _read_pattern(m: Params) -> Pattern:
    m.only("field", "equals", "regex")
    field = m.field_path("field")
    if m.has("equals") == m.has("regex"):
        raise m.doc.error(m.path, "needs exactly one of 'equals' or 'regex'")
    if m.has("equals"):
        return Pattern(field, equals=m.get("equals", (str, int, float, bool)))
    text = m.get("regex", str)
    try:
        return Pattern(field, regex=re.compile(text))
    except re.error as exc:
        raise m.error("regex", f"is not a regular expression: {exc}") from None
