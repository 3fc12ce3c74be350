"""The join node: All (AND), Any (OR) and Only one (XOR) over message types (seed 000).

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
  activation.
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
activations sit in deadline order (deadlines grow with time because the
time-out is fixed), so each message and each expiry costs O(1) whatever
the number pending.

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

import json
from abc import abstractmethod
from collections import OrderedDict
from typing import Any, Iterable

from ..fields import BadInput, FieldPath
from ..params import Params
from .base import Emit, Msg, Node, msg_from_json, msg_json

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

    outlinks = ("passed", "nohit", "failure")

    def _take(self, msg: Msg, i: int, now: float) -> Emit:
        return Emit("passed", (msg,))


class _Timed(_Listed):
    """Joins with an activation ID and a time-out: open activations in deadline order."""

    def __init__(self, name: str, types: Iterable[str], *, type_field: FieldPath | str = "type",
                 activation_field: FieldPath | str, timeout: float):
        super().__init__(name, types, type_field)
        if not timeout > 0:
            raise ValueError("timeout must be > 0 seconds")
        self.activation_field = _as_path(activation_field)
        self.timeout = float(timeout)
        # activation -> deadline. Insertion order is deadline order: every
        # deadline is (a non-decreasing now) + (one fixed timeout), so the
        # oldest entry is always the next to fall due.
        self._deadlines: OrderedDict[Any, float] = OrderedDict()
        self._changed: set = set()  # activations whose state changed since changed_state()
        self._opened: dict[Any, int] = {}  # activation -> serial, to keep the order of equal deadlines

    def on_time(self, now: float) -> list[Emit]:
        now = self._advance(now)
        out: list[Emit] = []
        deadlines = self._deadlines
        while deadlines:
            act = next(iter(deadlines))
            if deadlines[act] > now:
                break
            del deadlines[act]
            self._changed.add(act)
            emit = self._close(act)
            if emit is not None:
                out.append(emit)
        return out

    # -- state per activation (see base) ------------------------------------
    def changed_state(self) -> dict[str, Any]:
        changed, self._changed = self._changed, set()
        # The key keeps the activation's type: 7 and "7" are two activations.
        return {json.dumps(act): self._entry(act) if act in self._deadlines else None for act in changed}

    def load_state(self, entries) -> None:
        # Insertion order is deadline order (ties keep the order they were opened in).
        for key, value in sorted(entries.items(), key=lambda kv: (kv[1]["d"], kv[1]["n"])):
            act = json.loads(key)
            self._deadlines[act] = value["d"]
            self._restore(act, value)
            self._serial = max(self._serial, value["n"])

    _serial = 0

    def _open(self, act: Any, deadline: float) -> None:
        self._deadlines[act] = deadline
        self._serial += 1
        self._opened[act] = self._serial

    def _entry(self, act: Any) -> dict:
        return {"d": self._deadlines[act], "n": self._opened[act]}

    def _restore(self, act: Any, value: dict) -> None:
        self._opened[act] = value["n"]

    def activations(self) -> int:
        """How many activations have an open time-out (AND groups or XOR windows)."""
        return len(self._deadlines)

    @abstractmethod
    def _close(self, act: Any) -> Emit | None:
        """The time-out of ``act`` elapsed; say what leaves, if anything."""

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
        until = self._deadlines.get(act)
        if until is not None:
            return Emit("discarded", (msg,), {"activation": act, "until": until})
        self._open(act, now + self.timeout)
        self._changed.add(act)
        return Emit("passed", (msg,), {"activation": act})

    def _close(self, act: Any) -> None:
        del self._opened[act]
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
        self._slots: dict[Any, list[Msg | None]] = {}  # activation -> one slot per listed type
        self._held = 0

    def next_deadline(self) -> float | None:
        for act in self._deadlines:
            return self._deadlines[act]
        return None

    def pending(self) -> int:
        return self._held

    def _take(self, msg: Msg, i: int, now: float) -> Emit | None:
        act = self._activation(msg.doc)
        slots = self._slots.get(act)
        self._changed.add(act)
        if slots is None:
            slots = self._slots[act] = [None] * len(self.types)
            self._open(act, now + self.timeout)
        elif slots[i] is not None:
            return self._duplicate(act, slots, i, msg)
        slots[i] = msg
        self._held += 1
        if None in slots:
            return None
        del self._slots[act], self._deadlines[act], self._opened[act]
        self._held -= len(slots)
        return Emit("joined", tuple(slots), {"activation": act})

    def _entry(self, act: Any) -> dict:
        entry = super()._entry(act)
        entry["s"] = [None if m is None else msg_json(m) for m in self._slots[act]]
        return entry

    def _restore(self, act: Any, value: dict) -> None:
        super()._restore(act, value)
        slots = self._slots[act] = [None if m is None else msg_from_json(m) for m in value["s"]]
        self._held += sum(m is not None for m in slots)

    def _duplicate(self, act: Any, slots: list[Msg | None], i: int, msg: Msg) -> Emit:
        kind = self.types[i]
        if self.duplicate == "keep_first":
            reason = f"an instance of '{kind}' is already waiting"
            return Emit("discarded", (msg,), {"activation": act, "reason": reason})
        old, slots[i] = slots[i], msg
        return Emit("discarded", (old,), {"activation": act, "reason": f"replaced by a later instance of '{kind}'"})

    def _close(self, act: Any) -> Emit:
        slots = self._slots.pop(act)
        del self._opened[act]
        msgs = tuple(m for m in slots if m is not None)
        self._held -= len(msgs)
        missing = [t for t, m in zip(self.types, slots) if m is None]
        return Emit("expired", msgs, {"activation": act, "missing": missing})


def build(name: str, p: Params) -> Node:
    """A join node from its flow-file parameters; see docs/nodes/join.md."""
    p.only("join_type", "types", "type_field", "activation_field", "timeout", "duplicate")
    join_type = p.choice("join_type", JOIN_TYPES, "and")
    types = _types(p)
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


def _types(p: Params) -> list[str]:
    types = p.str_list("types")
    for i, kind in enumerate(types):
        if kind in types[:i]:
            raise p.doc.error(f"{p.field_name('types')}[{i}]", f"'{kind}' is listed twice (list each type once)")
    return types


def _refuse(p: Params, fields: tuple[str, ...], reason: str) -> None:
    for f in fields:
        if p.has(f):
            raise p.error(f, reason)
