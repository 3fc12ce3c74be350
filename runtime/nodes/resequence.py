"""The Resequence node: messages of each sequence group leave in sequence-number order (after IBM App Connect Enterprise).

Each message carries a sequence number (``sequence_number``, an integer
field) and optionally a group identifier (``group``). A group instance
expects ``start`` first, then ``start + 1``, and so on: a message that is
next leaves at once through ``out``, followed by every held message it
unblocks; any other message is held until its turn.

The instance closes when it has passed its end number (``end.literal``, or
the number of the message that matches ``end.predicate``), or, with
``end.automatic``, when it has held nothing for that many seconds. The next
message of a closed group opens a new instance (which expects ``start``
again).

Missing messages. While a group holds messages but lacks the next one, a
``missing_message_timeout`` timer runs (restarted whenever a message leaves).
When it fires, the node gives up on the missing numbers: it moves on to the
lowest held number, and from then on every message of that instance leaves
through ``expired`` instead of ``out``, still in number order. A skipped
number that arrives later leaves through ``missing``.

Bad input goes to ``failure`` with ``info["reason"]`` and changes nothing:
no sequence number or group field, a value of the wrong type, a number below
``start`` or beyond the known end, a number already taken in this instance
(a duplicate), or a message the predicate marks last while a higher number
was already collected.

Every message that enters leaves exactly once, by ``out``, ``expired``,
``missing`` or ``failure``. Held messages (``pending()``) leave within one
``missing_message_timeout`` per gap below them. A group that has held nothing
keeps a small record until its end arrives or ``idle_timeout`` closes it.

>>> from twinflow.runtime.params import Doc, Params
>>> doc = Doc("sequence_number: seq\\nend: {literal: 2}\\nmissing_message_timeout: 5\\n", "f.yaml")
>>> node = build("reorder", Params(doc, "", doc.value))
>>> [e.msgs[0].id for n in (2, 1, 0) for e in node.on_message(Msg(f"m{n}", {"seq": n}), now=0.0)]
['m0', 'm1', 'm2']
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from typing import Hashable

from ..fields import BadInput, FieldPath, MissingField
from ..json_text import key_text
from ..params import Params
from .base import Emit, Msg, Node, msg_from_json, msg_json
from .deadlines import GroupTimers, Timed, load_order, restore_timer, timed_entry
from .sequence import SEQ_MAX, End, group_reader, read_idle, read_number


class _Instance(Timed):
    """One open group instance; its deadline is the missing-message one while it holds messages, else the idle one."""

    __slots__ = ("next", "held", "order", "end", "highest", "expired", "skipped")

    def __init__(self, key: Hashable, start: int, end: int | None):
        super().__init__(key)
        self.next = start                # the number expected next
        self.held: dict[int, Msg] = {}   # number -> message waiting for its turn
        self.order: list[int] = []       # heap of the held numbers
        self.end = end                   # last number, once known
        self.highest: int | None = None  # highest number collected so far
        self.expired = False             # a missing-message timeout has fired
        self.skipped: list[tuple[int, int]] | None = None  # numbers given up on: sorted (low, high)

    def was_skipped(self, n: int) -> bool:
        """True (once) if ``n`` was given up on; it is then no longer skipped."""
        if self.skipped is None:
            return False
        i = bisect_right(self.skipped, (n, SEQ_MAX)) - 1
        if i < 0 or self.skipped[i][1] < n:
            return False
        low, high = self.skipped[i]
        self.skipped[i:i + 1] = [r for r in ((low, n - 1), (n + 1, high)) if r[0] <= r[1]]
        return True


class Resequence(Node):
    """Reorders messages per group; see the module docstring."""

    kind = "resequence"
    outlinks = ("out", "expired", "missing", "failure")

    def __init__(self, name: str, *, number: FieldPath, group: FieldPath | None, start: int, end: End,
                 missing_timeout: float, idle: float | None):
        super().__init__(name)
        self._number = number
        self._get_number = number.get
        self._group = group_reader(group)
        self._with_group = group is not None
        self.start = start
        self._end = end
        self._predicate = end.predicate
        self._missing_timeout = missing_timeout
        self._idle = idle
        self._open: dict[Hashable, _Instance] = {}
        self._timers = GroupTimers(self._open.get)
        self._held = 0
        self._changed: set[Hashable] = set()

    # -- state per group instance (see base) ----------------------------------
    def changed_state(self) -> dict:
        changed, self._changed = self._changed, set()
        return {key_text(key): self._entry(self._open[key]) if key in self._open else None for key in changed}

    @staticmethod
    def _entry(inst: _Instance) -> dict:
        return timed_entry(inst, {
            "next": inst.next, "held": [[n, msg_json(m)] for n, m in inst.held.items()], "end": inst.end,
            "highest": inst.highest, "expired": inst.expired, "skipped": inst.skipped})

    def load_state(self, entries) -> None:
        for key, value in load_order(entries):
            inst = self._open[key] = _Instance(key, value["next"], value["end"])
            inst.held = {n: msg_from_json(m) for n, m in value["held"]}
            inst.order = sorted(inst.held)
            inst.highest, inst.expired = value["highest"], value["expired"]
            inst.skipped = [tuple(r) for r in value["skipped"]] if value["skipped"] is not None else None
            self._held += len(inst.held)
            restore_timer(self._timers, inst, value)

    @property
    def open_groups(self) -> int:
        return len(self._open)

    def pending(self) -> int:
        return self._held

    def pending_counts(self) -> dict[str, int]:
        return {"held": self._held, "groups": len(self._open)}

    def next_deadline(self) -> float | None:
        """The next missing-message time-out, or the next idle close (which emits nothing)."""
        return self._timers.next()

    # -- input ------------------------------------------------------------
    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        # Fire overdue deadlines first, so the result never depends on how often the engine ticks.
        out = self.on_time(now) if self._timers.due(now) else []
        doc = msg.doc
        try:
            key = self._group(doc)
            n = self._number_of(doc)
            inst = self._open.get(key)
            last = self._predicate is not None and self._predicate(doc)
            self._check(inst, n, last)
        except BadInput as exc:
            out.append(Emit("failure", (msg,), {"reason": str(exc)}))
            return out
        self._changed.add(key)
        if inst is None:
            inst = self._open[key] = _Instance(key, self.start, self._end.literal)
        elif n < inst.next:  # _check let it through: a skipped number, late
            out.append(Emit("missing", (msg,), self._info(key, n)))
            if not inst.held:
                self._wait_idle(inst, now)
            return out
        if last:
            inst.end = n  # _check made sure nothing higher was collected
        if inst.highest is None or n > inst.highest:
            inst.highest = n
        if n == inst.next:
            self._release(inst, msg, now, out)
        else:
            self._hold(inst, n, msg, now)
        return out

    def _number_of(self, doc) -> int:
        try:
            n = self._get_number(doc)
        except MissingField as exc:
            raise BadInput(str(exc)) from None
        if type(n) is not int:
            raise BadInput(f"sequence number '{self._number.path}' must be an integer (got {n!r})")
        if not -SEQ_MAX <= n <= SEQ_MAX:
            raise BadInput(f"sequence number {n} is outside -{SEQ_MAX}..{SEQ_MAX}")
        return n

    def _check(self, inst: _Instance | None, n: int, last: bool) -> None:
        """Raise BadInput if the number cannot join this group instance.

        A skipped number passes (and stops being skipped): it leaves through ``missing``.
        """
        if n < self.start:
            raise BadInput(f"sequence number {n} is below the start of sequence ({self.start})")
        end = self._end.literal if inst is None else inst.end
        if end is not None and n > end:
            raise BadInput(f"sequence number {n} is beyond the end of sequence ({end})")
        if inst is None:
            return
        if n < inst.next:
            if inst.was_skipped(n):
                return
            raise BadInput(f"duplicate: sequence number {n} already left this group instance")
        if n in inst.held:
            raise BadInput(f"duplicate: sequence number {n} is already held in this group instance")
        if last and inst.highest is not None and inst.highest > n:
            raise BadInput(f"the end-of-sequence predicate marks {n} last, "
                           f"but {inst.highest} was already collected in this group instance")

    # -- holding and releasing ------------------------------------------
    def _hold(self, inst: _Instance, n: int, msg: Msg, now: float) -> None:
        if not inst.held:  # the group just became blocked on a missing number
            self._timers.set(inst, now + self._missing_timeout)
        inst.held[n] = msg
        heapq.heappush(inst.order, n)
        self._held += 1

    def _release(self, inst: _Instance, msg: Msg, now: float, out: list[Emit]) -> None:
        """Send ``msg`` (number ``inst.next``) and every held message that follows it without a gap."""
        outlink = "expired" if inst.expired else "out"
        held = inst.held
        while True:
            n = inst.next
            out.append(Emit(outlink, (msg,), self._info(inst.key, n)))
            if n == inst.end:
                self._timers.cancel(inst)
                del self._open[inst.key]
                return
            inst.next = n + 1
            msg = held.pop(n + 1, None)
            if msg is None:
                break
            heapq.heappop(inst.order)
            self._held -= 1
        if held:  # progress, but blocked again: wait afresh for the new next number
            self._timers.set(inst, now + self._missing_timeout)
        else:
            self._wait_idle(inst, now)

    def _wait_idle(self, inst: _Instance, now: float) -> None:
        if self._idle is None:
            self._timers.cancel(inst)
        else:
            self._timers.set(inst, now + self._idle)

    def _info(self, key: Hashable, n: int) -> dict:
        return {"group": key, "seq": n} if self._with_group else {"seq": n}

    # -- time -------------------------------------------------------------
    def on_time(self, now: float) -> list[Emit]:
        out: list[Emit] = []
        while (fired := self._timers.pop(now)) is not None:
            at, inst = fired
            self._changed.add(inst.key)
            if inst.held:
                self._skip_gap(inst, at, out)
            else:
                del self._open[inst.key]  # idle: nothing to send, the group just closes
        return out

    def _skip_gap(self, inst: _Instance, at: float, out: list[Emit]) -> None:
        """Missing-message time-out: give up on the numbers below the lowest held one."""
        lowest = heapq.heappop(inst.order)
        if inst.skipped is None:
            inst.skipped = []
        inst.skipped.append((inst.next, lowest - 1))
        inst.next = lowest
        inst.expired = True
        self._held -= 1
        self._release(inst, inst.held.pop(lowest), at, out)


def build(name: str, p: Params) -> Resequence:
    p.only("sequence_number", "group", "start", "end", "missing_message_timeout", "idle_timeout")
    start = read_number(p, "start", 0)
    end = End.read(p, start)
    return Resequence(name, number=p.field_path("sequence_number"), group=p.field_path("group", None),
                      start=start, end=end, missing_timeout=p.seconds("missing_message_timeout", positive=True),
                      idle=read_idle(p, end))
