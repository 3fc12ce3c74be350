"""The join node: All (AND), Any (OR) and Only one (XOR) over message types (after webMethods Integration Server's join conditions).

A join reads each message's type (``type_field``) and, for AND and XOR, its
activation ID (``activation_field``), the value that ties the messages of one
join together. What it promises:

- **AND** holds the messages of an activation until one instance of every
  listed type has arrived, then emits them as one group through ``joined``, in
  the order the types are listed. The first message of an activation starts
  the join time-out; a group still incomplete when it elapses leaves through
  ``expired`` (never silently dropped), and a message arriving after that
  starts a new group and a new time-out. A second instance of a type already
  waiting leaves through ``discarded`` (``duplicate: keep_first``, the
  default) or replaces the waiting one, which then leaves through
  ``discarded`` (``keep_last``); either way the time-out is not restarted.
- **OR** emits every message of a listed type at once through ``passed``;
  it keeps no state and reads no activation ID.
- **XOR** emits the first message of an activation through ``passed`` and
  starts the time-out; every later message of a listed type with that
  activation ID leaves through ``discarded`` until the time-out elapses, then
  the next one passes and starts a new window. Over one type it dedupes per
  activation; that type may be listed twice, as webMethods writes it
  (``types: [documentA, documentA]``).
- A message whose type is not listed leaves through ``nohit``. A message that
  lacks the type or activation field, or holds a value of the wrong type
  there (the type must be a string; the activation ID a string or an
  integer), leaves through ``failure`` with ``info["reason"]``; the node
  keeps running.

Every message that enters leaves exactly once. Windows are half-open: a
message that arrives exactly when a time-out elapses is too late, because
the time-out fires first. Each call fires every deadline at or before its
``now`` first, so ``on_message`` alone gives the same result as an engine
that calls ``on_time`` at each deadline (only the emission time differs).
Time never runs backwards inside a node: a ``now`` earlier than one already
seen counts as the latest seen.

State per activation (in Redis on the cluster, see base): an open AND
group is its deadline and its slots; an XOR window its deadline.

State: AND holds fewer than ``len(types)`` messages per open activation, each
for at most ``timeout``; XOR keeps one deadline per activation that passed a
message in the last ``timeout`` (no messages); OR keeps nothing. Open
activations' time-outs sit in the nodes' one deadline queue (``deadlines.py``):
O(log n) per message and per expiry, whatever the number pending.

>>> node = AndJoin("j", ["order", "payment"], activation_field="order_id", timeout=10.0)
>>> node.on_message(Msg("m1", {"type": "order", "order_id": 7}), now=0.0)
[]
>>> [emit] = node.on_message(Msg("m2", {"type": "payment", "order_id": 7}), now=1.0)
>>> emit.outlink, [m.id for m in emit.msgs]
('joined', ['m1', 'm2'])
>>> node.on_message(Msg("m3", {"type": "order"}), now=2.0)[0].info
{'reason': "message has no field 'order_id'"}
"""

from __future__ import annotations

from abc import abstractmethod
from typing import Any, Iterable

from ..fields import BadInput, FieldPath
from ..json_text import key_text
from ..params import Params
from .base import Emit, Msg, Node, msg_from_json, msg_json
from .deadlines import GroupTimers, Timed, load_order, restore_timer, timed_entry

JOIN_TYPES = ("and", "or", "xor")
DUPLICATES = ("keep_first", "keep_last")


def _as_path(path: FieldPath | str) -> FieldPath:
    return path if isinstance(path, FieldPath) else FieldPath(path)


class _Listed(Node):
    """What every join type shares: reading the type, routing nohit and failure."""

    kind = "join"

    def __init__(self, name: str, types: Iterable[str], type_field: FieldPath | str = "type"):
        super().__init__(name)
        self.types = tuple(types)
        if not self.types or len(set(self.types)) != len(self.types):
            raise ValueError("types must list at least one type, each once")
        self.type_field = _as_path(type_field)
        self._index = {t: i for i, t in enumerate(self.types)}
        self._now = float("-inf")

    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        now = self._advance(now)
        out = self.on_time(now)  # deadlines due at ``now`` fire before the message, as in replay
        try:
            i = self._type_index(msg.doc)
            emit = self._nohit(msg) if i is None else self._take(msg, i, now)
        except BadInput as exc:
            emit = Emit("failure", (msg,), {"reason": str(exc)})
        if emit is not None:
            out.append(emit)
        return out

    @abstractmethod
    def _take(self, msg: Msg, i: int, now: float) -> Emit | None:
        """Route a message of the listed type ``types[i]``; None while it is held."""

    def _advance(self, now: float) -> float:
        if now > self._now:
            self._now = now
        return self._now

    def _type_index(self, doc) -> int | None:
        value = self.type_field.get(doc)
        if not isinstance(value, str):
            raise BadInput(f"field '{self.type_field.path}' (the message type) must be a string, "
                           f"not {type(value).__name__}")
        return self._index.get(value)

    def _nohit(self, msg: Msg) -> Emit:
        return Emit("nohit", (msg,), {"type": self.type_field.get(msg.doc)})


class OrJoin(_Listed):
    """Any (OR): every message of a listed type passes at once; no state.

    >>> node = OrJoin("j", ["email", "sms"], type_field="channel")
    >>> [e.outlink for e in node.on_message(Msg("n1", {"channel": "fax"}), now=0.0)]
    ['nohit']
    """

    sets_deadlines_after_now = True  # none at all

    outlinks = ("passed", "nohit", "failure")

    def _take(self, msg: Msg, i: int, now: float) -> Emit:
        return Emit("passed", (msg,))


class _Window(Timed):
    """One open activation: its time-out (see deadlines) and, for AND, one slot per listed type."""

    __slots__ = ("slots",)

    def __init__(self, act: Any, slots: list[Msg | None] | None = None):
        super().__init__(act)
        self.slots = slots


class _Timed(_Listed):
    """Joins with an activation ID and a time-out: open activations in the node's deadline queue."""

    sets_deadlines_after_now = True  # now + timeout, and the time-out is > 0

    def __init__(self, name: str, types: Iterable[str], *, type_field: FieldPath | str = "type",
                 activation_field: FieldPath | str, timeout: float):
        super().__init__(name, types, type_field)
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds")
        self.activation_field = _as_path(activation_field)
        self.timeout = float(timeout)
        self._open: dict[Any, _Window] = {}
        self._timers = GroupTimers(self._open.get)
        self._changed: set = set()  # activations whose state changed since changed_state()
        # Of those, the ones not open when they first changed: stored nowhere (the node holds
        # what the steps before wrote), so one that is gone again needs no delete.
        self._fresh: set = set()

    def on_time(self, now: float) -> list[Emit]:
        now = self._advance(now)
        out: list[Emit] = []
        while (fired := self._timers.pop(now)) is not None:
            window = fired[1]
            self._touch(window.key)
            del self._open[window.key]
            emit = self._close(window)
            if emit is not None:
                out.append(emit)
        return out

    def next_deadline(self) -> float | None:
        return self._timers.next()

    # -- state per activation (see base) ------------------------------------
    def changed_state(self) -> dict[str, Any]:
        changed, fresh, opened = self._changed, self._fresh, self._open
        self._changed, self._fresh = set(), set()
        # The key keeps the activation's type: 7 and "7" are two activations. One opened and
        # closed since the last call changed nothing stored: left out.
        return {key_text(act): self._entry(opened[act]) if act in opened else None
                for act in changed if act in opened or act not in fresh}

    def _touch(self, act: Any) -> None:
        """Record that ``act``'s entry changes now (before the change)."""
        if act not in self._changed:
            self._changed.add(act)
            if act not in self._open:
                self._fresh.add(act)

    def load_state(self, entries) -> None:
        for act, value in load_order(entries):
            window = self._open[act] = self._restore(act, value)
            restore_timer(self._timers, window, value)

    def _entry(self, window: _Window) -> dict:
        return timed_entry(window, {})

    def _restore(self, act: Any, value: dict) -> _Window:
        return _Window(act)

    def _start(self, act: Any, now: float, slots: list[Msg | None] | None = None) -> _Window:
        window = self._open[act] = _Window(act, slots)
        self._timers.set(window, now + self.timeout)
        return window

    def activations(self) -> int:
        """How many activations have an open time-out (AND groups or XOR windows)."""
        return len(self._open)

    def pending_counts(self) -> dict[str, Any]:
        return {"held": self.pending(), "groups": len(self._open)}  # groups: activations open

    @abstractmethod
    def _close(self, window: _Window) -> Emit | None:
        """The time-out of ``window`` elapsed; say what leaves, if anything."""

    def _activation(self, doc) -> str | int:
        value = self.activation_field.get(doc)
        # bool is an int in Python, and True would join activation 1.
        if isinstance(value, bool) or not isinstance(value, (str, int)):
            raise BadInput(f"field '{self.activation_field.path}' (the activation ID) must be a string "
                           f"or an integer, not {type(value).__name__}")
        return value


class XorJoin(_Timed):
    """Only one (XOR): the first message of an activation passes; the rest of its window is discarded.

    >>> node = XorJoin("j", ["alert"], activation_field="host", timeout=60.0)
    >>> [node.on_message(Msg(f"a{t}", {"type": "alert", "host": "db1"}), now=t)[0].outlink for t in (0, 59, 60)]
    ['passed', 'discarded', 'passed']
    """

    outlinks = ("passed", "discarded", "nohit", "failure")

    def _take(self, msg: Msg, i: int, now: float) -> Emit:
        act = self._activation(msg.doc)
        window = self._open.get(act)
        if window is not None:
            return Emit("discarded", (msg,), {"activation": act, "until": window.due})
        self._touch(act)
        self._start(act, now)
        return Emit("passed", (msg,), {"activation": act})

    def _close(self, window: _Window) -> None:
        return None  # the window only blocked; it holds no message


class AndJoin(_Timed):
    """All (AND): one instance of every type per activation, within the time-out the first started.

    >>> node = AndJoin("j", ["a", "b", "c"], activation_field="k", timeout=5.0)
    >>> node.on_message(Msg("m1", {"type": "b", "k": "x"}), now=0.0)
    []
    >>> node.next_deadline(), node.pending()
    (5.0, 1)
    >>> [(e.outlink, e.info["missing"]) for e in node.on_time(5.0)]
    [('expired', ['a', 'c'])]
    """

    outlinks = ("joined", "expired", "discarded", "nohit", "failure")

    def __init__(self, name: str, types: Iterable[str], *, type_field: FieldPath | str = "type",
                 activation_field: FieldPath | str, timeout: float, duplicate: str = "keep_first"):
        super().__init__(name, types, type_field=type_field, activation_field=activation_field, timeout=timeout)
        if len(self.types) < 2:
            raise ValueError("an AND join needs at least two types")
        if duplicate not in DUPLICATES:
            raise ValueError(f"duplicate must be one of {', '.join(DUPLICATES)}")
        self.duplicate = duplicate
        self._held = 0

    def pending(self) -> int:
        return self._held

    def _take(self, msg: Msg, i: int, now: float) -> Emit | None:
        act = self._activation(msg.doc)
        window = self._open.get(act)
        self._touch(act)
        if window is None:
            window = self._start(act, now, [None] * len(self.types))
        elif window.slots[i] is not None:
            return self._duplicate(act, window.slots, i, msg)
        slots = window.slots
        slots[i] = msg
        self._held += 1
        if None in slots:
            return None
        del self._open[act]
        self._timers.cancel(window)
        self._held -= len(slots)
        return Emit("joined", tuple(slots), {"activation": act})

    def _entry(self, window: _Window) -> dict:
        return timed_entry(window, {"m": [None if m is None else msg_json(m) for m in window.slots]})

    def _restore(self, act: Any, value: dict) -> _Window:
        slots = [None if m is None else msg_from_json(m) for m in value["m"]]
        self._held += sum(m is not None for m in slots)
        return _Window(act, slots)

    def _duplicate(self, act: Any, slots: list[Msg | None], i: int, msg: Msg) -> Emit:
        kind = self.types[i]
        if self.duplicate == "keep_first":
            reason = f"an instance of '{kind}' is already waiting"
            return Emit("discarded", (msg,), {"activation": act, "reason": reason})
        old, slots[i] = slots[i], msg
        return Emit("discarded", (old,), {"activation": act, "reason": f"replaced by a later instance of '{kind}'"})

    def _close(self, window: _Window) -> Emit:
        msgs = tuple(m for m in window.slots if m is not None)
        self._held -= len(msgs)
        missing = [t for t, m in zip(self.types, window.slots) if m is None]
        return Emit("expired", msgs, {"activation": window.key, "missing": missing})


def build(name: str, p: Params) -> Node:
    """A join node from its flow-file parameters; see docs/reference/nodes/join.md."""
    p.only("join_type", "types", "type_field", "activation_field", "timeout", "duplicate")
    join_type = p.choice("join_type", JOIN_TYPES, "and")
    types = _types(p, join_type)
    type_field = p.field_path("type_field", FieldPath("type"))
    if join_type == "or":
        _refuse(p, ("activation_field", "timeout", "duplicate"), "has no effect when join_type is or "
                "(an OR join keeps no state, reads no activation ID and has no time-out)")
        return OrJoin(name, types, type_field)
    activation_field = p.field_path("activation_field")
    timeout = p.seconds("timeout", positive=True)
    if join_type == "xor":
        _refuse(p, ("duplicate",), "has no effect when join_type is xor (only an AND join holds messages)")
        return XorJoin(name, types, type_field=type_field, activation_field=activation_field, timeout=timeout)
    if len(types) < 2:
        raise p.error("types", "an AND join needs at least two types "
                               "(for one message per activation and time-out, use join_type: xor)")
    return AndJoin(name, types, type_field=type_field, activation_field=activation_field, timeout=timeout,
                   duplicate=p.choice("duplicate", DUPLICATES, "keep_first"))


def _types(p: Params, join_type: str) -> list[str]:
    """``types``, each once. XOR may list a type more than once, as webMethods writes its one-type
    condition ("documentA and documentA": one and only one documentA per activation ID and
    time-out): a type listed again adds nothing, since XOR passes one message of any listed
    type per window. AND and OR refuse it (AND would wait for a type it already holds)."""
    types = p.str_list("types")
    for i, kind in enumerate(types):
        if kind in types[:i] and join_type != "xor":
            raise p.doc.error(f"{p.field_name('types')}[{i}]", f"'{kind}' is listed twice (list each type once; "
                                                               f"only an xor join may repeat a type)")
    return list(dict.fromkeys(types))


def _refuse(p: Params, fields: tuple[str, ...], reason: str) -> None:
    for f in fields:
        if p.has(f):
            raise p.error(f, reason)
