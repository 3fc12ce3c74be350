"""The Sequence node: a monotonically increasing number per sequence group (after IBM App Connect Enterprise).

Every message leaves at once through ``out``, with the number it was given
in ``info["seq"]`` (and ``info["last"]``, true when it ended its group
instance). Numbers in a group run ``start``, ``start + 1``, ... and are never
given twice in one group instance. The instance ends after the message that

- reaches the ``end.literal`` number, or
- matches the ``end.predicate`` (a field test, see :class:`Predicate`), or
- is followed by ``end.automatic`` seconds without a message for its group.

The next message of that group opens a new instance that starts over at
``start``. Groups come from the ``group`` field path (all messages form one
group without it).

Bad input: a message that lacks the group field, or whose group is not a
string or an integer, leaves through ``failure`` with ``info["reason"]``; it
is given no number and changes nothing. A missing predicate field is not an
error: it means "not last", as a missing node does for ACE's XPath predicate.

The node holds no messages (``pending()`` is 0); it keeps one counter per
open group instance. With ``end.literal`` or ``end.predicate``, an instance
whose end never comes keeps its counter until ``idle_timeout`` closes it;
without that parameter this state grows with the number of distinct groups.

This module also holds what the Resequence node shares with it: the
end-of-sequence definition, the predicate and the per-group timers.

>>> from twinflow.runtime.params import Doc, Params
>>> doc = Doc("group: grp\\nend: {literal: 1}\\n", "f.yaml")
>>> node = build("number", Params(doc, "", doc.value))
>>> [e.info["seq"] for e in (node.on_message(Msg(str(i), {"grp": "a"}), 0.0)[0] for i in range(3))]
[0, 1, 0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Mapping

from ..fields import BadInput, FieldPath, MissingField
from ..json_text import key_text
from ..params import Params
from .base import Emit, Msg, Node
from .deadlines import GroupTimers, Timed, load_order, restore_timer, timed_entry

SEQ_MAX = 9223372036854775807  # ACE's range is -SEQ_MAX .. SEQ_MAX

_SCALARS = (str, int, float, bool, type(None))


# -- reading messages and parameters (shared with resequence) ---------------

def _same(a: Any, b: Any) -> bool:
    # JSON true is not 1 and "1" is not 1: compare bools only with bools.
    return (type(a) is bool) == (type(b) is bool) and a == b


def truth(value: Any) -> bool:
    """ACE's truth table for a predicate value.

    A boolean is itself; a number is true unless 0; a string is true when it
    is "true" in any case; anything else (null, a list, a mapping) is false.
    """
    if type(value) is bool:
        return value
    if isinstance(value, (int, float)):
        return value != 0
    if isinstance(value, str):
        return value.lower() == "true"
    return False


class Predicate:
    """Whether a message is the last of its sequence: one field test, no code.

    ``{field: P}`` tests the value's :func:`truth`; ``{field: P, equals: V}``
    tests equality with one JSON scalar; ``{field: P, in: [V, ...]}`` tests
    membership. A message without the field is never last.

    >>> Predicate(FieldPath("kind"), ("end", "final"))({"kind": "final"})
    True
    >>> Predicate(FieldPath("last"), None)({"last": "TRUE"}), Predicate(FieldPath("last"), None)({})
    (True, False)
    """

    def __init__(self, path: FieldPath, values: tuple | None):
        self.path, self.values = path, values
        self._get = path.get

    def __call__(self, doc: Mapping[str, Any]) -> bool:
        try:
            value = self._get(doc)
        except MissingField:
            return False
        if self.values is None:
            return truth(value)
        return any(_same(value, v) for v in self.values)

    @classmethod
    def read(cls, p: Params) -> "Predicate":
        p.only("field", "equals", "in")
        path = p.field_path("field")
        if p.has("equals") and p.has("in"):
            raise p.error("in", "give either equals or in, not both")
        if p.has("equals"):
            return cls(path, (p.get("equals", _SCALARS),))
        if p.has("in"):
            items = p.get("in", list, check=bool, why="must list at least one value")
            for i, item in enumerate(items):
                if not isinstance(item, _SCALARS):
                    raise p.doc.error(f"{p.field_name('in')}[{i}]",
                                      f"must be a string, number, boolean or null (got {item!r})")
            return cls(path, tuple(items))
        return cls(path, None)


def read_number(p: Params, name: str, default: Any = ...) -> int:
    """A sequence number in ACE's range."""
    kw = {} if default is ... else {"default": default}
    return p.get(name, int, **kw, check=lambda v: -SEQ_MAX <= v <= SEQ_MAX,
                 why=f"must be between -{SEQ_MAX} and {SEQ_MAX}")


@dataclass(frozen=True)
class End:
    """How a group instance ends: exactly one of the three is set."""

    literal: int | None = None
    automatic: float | None = None
    predicate: Predicate | None = None

    @classmethod
    def read(cls, p: Params, start: int) -> "End":
        e = p.section("end")
        e.only("literal", "automatic", "predicate")
        given = [k for k in ("literal", "automatic", "predicate") if e.has(k)]
        if len(given) != 1:
            got = f" (got {', '.join(given)})" if given else ""
            raise p.error("end", f"must set exactly one of literal, automatic, predicate{got}")
        if e.has("literal"):
            literal = read_number(e, "literal")
            if literal < start:
                raise e.error("literal", f"must be >= start ({start}) (got {literal})")
            return cls(literal=literal)
        if e.has("automatic"):
            return cls(automatic=e.seconds("automatic", positive=True))
        return cls(predicate=Predicate.read(e.section("predicate")))


def read_idle(p: Params, end: End) -> float | None:
    """How long an empty group instance stays open: ``end.automatic``, else ``idle_timeout``."""
    idle = p.seconds("idle_timeout", None, positive=True)
    if idle is not None and end.automatic is not None:
        raise p.error("idle_timeout", "end.automatic already closes idle groups; set only one")
    return end.automatic if end.automatic is not None else idle


def group_reader(path: FieldPath | None) -> Callable[[Mapping[str, Any]], Hashable]:
    """Reads a message's group identifier: a string or an integer (None for every message without a path)."""
    if path is None:
        return lambda doc: None
    get = path.get

    def group(doc: Mapping[str, Any]) -> Hashable:
        try:
            key = get(doc)
        except MissingField as exc:
            raise BadInput(str(exc)) from None
        if type(key) is not str and type(key) is not int:
            raise BadInput(f"group identifier '{path.path}' must be a string or an integer (got {key!r})")
        return key

    return group


class _Counter(Timed):
    """One open group instance: the number its next message gets."""

    __slots__ = ("next",)

    def __init__(self, key: Hashable, start: int):
        super().__init__(key)
        self.next = start


class Sequence(Node):
    """Numbers messages per group; see the module docstring."""

    kind = "sequence"
    outlinks = ("out", "failure")

    def __init__(self, name: str, *, group: FieldPath | None, start: int, end: End, idle: float | None):
        super().__init__(name)
        self._group = group_reader(group)
        self._with_group = group is not None
        self.start = start
        # Predicate and automatic instances still stop at the top of the range.
        self._last = end.literal if end.literal is not None else SEQ_MAX
        self._predicate = end.predicate
        self._idle = idle
        self._open: dict[Hashable, _Counter] = {}
        self._timers = GroupTimers(self._open.get)
        self._changed: set[Hashable] = set()

    @property
    def open_groups(self) -> int:
        return len(self._open)

    def pending_counts(self) -> dict[str, int]:
        return {"held": 0, "groups": len(self._open)}  # a sequence holds no message, only each group's count

    # -- state per group (see base) -------------------------------------------
    def changed_state(self) -> dict:
        changed, self._changed = self._changed, set()
        return {key_text(key): timed_entry(self._open[key], {"n": self._open[key].next})
                if key in self._open else None for key in changed}

    def load_state(self, entries) -> None:
        for key, value in load_order(entries):
            c = self._open[key] = _Counter(key, value["n"])
            restore_timer(self._timers, c, value)

    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        if self._timers.due(now):
            self.on_time(now)  # close idle groups first, whoever drives the clock
        try:
            key = self._group(msg.doc)
        except BadInput as exc:
            return [Emit("failure", (msg,), {"reason": str(exc)})]
        self._changed.add(key)
        c = self._open.get(key)
        if c is None:
            c = self._open[key] = _Counter(key, self.start)
        n = c.next
        last = n == self._last or (self._predicate is not None and self._predicate(msg.doc))
        if last:
            del self._open[key]
            self._timers.cancel(c)
        else:
            c.next = n + 1
            if self._idle is not None:
                self._timers.set(c, now + self._idle)
        info = {"group": key, "seq": n, "last": last} if self._with_group else {"seq": n, "last": last}
        return [Emit("out", (msg,), info)]

    def on_time(self, now: float) -> list[Emit]:
        """Close every group idle since ``now - automatic``; nothing leaves."""
        while (fired := self._timers.pop(now)) is not None:
            del self._open[fired[1].key]
            self._changed.add(fired[1].key)
        return []

    def next_deadline(self) -> float | None:
        """When the next idle group closes (nothing leaves then, but its counter restarts)."""
        return self._timers.next()


def build(name: str, p: Params) -> Sequence:
    p.only("group", "start", "end", "idle_timeout")
    start = read_number(p, "start", 0)
    end = End.read(p, start)
    return Sequence(name, group=p.field_path("group", None), start=start, end=end, idle=read_idle(p, end))
