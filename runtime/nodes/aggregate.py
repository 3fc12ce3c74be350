"""The aggregate node: a Direct Project message monitor as pure logic.

An original message (type ``IMF``) names its recipients; notifications
(``MDN`` and ``DSN``) name the original they answer and a recipient. The node
gathers each original and its notifications into one group, keyed by the
original's message ID, and promises:

- **complete**: as soon as every recipient of the original is complete under
  the group's rule, the whole group (original and notifications, in arrival
  order) leaves in one emission through ``complete``.

  * ``timely_and_reliable``: a recipient is complete on an MDN ``processed``
    AND an MDN ``dispatched`` carrying the disposition option
    ``X-DIRECT-FINAL-DESTINATION-DELIVERY``; or on an MDN ``denied``/``error``;
    or on a DSN whose action is ``failed``.
  * ``general``: a recipient is complete on any MDN or DSN naming it.
  * ``variable``: the original chooses, by its timely flag (by default the
    disposition option above in its ``disposition_options``).
- **timeout**: a group that is not complete within its completion timeout,
  counted from the group's first message (the decaying timeout: at every
  message the timer is reset to ``completion_timeout - (now - first)``,
  floored at 1 ms), leaves through ``timeout`` with ``info["incomplete"]``,
  the incomplete recipients in the original's order. A variable timeout
  takes the timely-and-reliable or the general timeout by the same flag.
- **orphan**: notifications whose original never arrived leave together
  through ``orphan`` when their group times out (a late original still joins
  them until then).
- **failure**, under bad input: a message without a field the node needs, with
  a value of the wrong type, an unknown message type, an original without
  recipients, or a second original for a group leaves alone through
  ``failure`` with ``info["reason"]`` and changes no state.

Every message leaves exactly once. A group is held at most its completion
timeout (plus 1 ms), so the state is bounded by arrival rate times timeout.

>>> node = Aggregate("agg", completion="general", timeout=60.0)
>>> node.on_message(Msg("o1", {"id": "o1", "type": "IMF", "recipients": "a@x, b@y"}), 0.0)
[]
>>> node.on_message(Msg("n1", {"id": "n1", "type": "DSN", "parent_id": "o1",
...                           "final_recipient": "rfc822; a@x", "action": "delayed"}), 1.0)
[]
>>> [(e.outlink, e.info["incomplete"]) for e in node.on_time(60.0)]
[('timeout', ['b@y'])]
"""

from __future__ import annotations

from dataclasses import dataclass
from operator import itemgetter
from typing import Any, Callable, Mapping

from ..fields import BadInput, FieldPath, MissingField
from ..params import Params
from .base import Emit, Msg, Node, msg_from_json, msg_json
from .deadlines import GroupTimers, Timed, restore_timer, timed_entry

TIMELY_OPTION = "x-direct-final-destination-delivery"
FLOOR = 0.001  # the decaying timeout never drops below 1 ms (Direct's DecayingTimeoutCondition)
RULES = ("timely_and_reliable", "general", "variable")

# What a notification says about each recipient it names, as bits that
# accumulate per recipient (a notification may come before its original).
NOTICE = 1       # any MDN or DSN: enough for the general rule
PROCESSED = 2    # MDN processed
DISPATCHED = 4   # MDN dispatched with the final-destination-delivery option
FAILED = 8       # MDN denied/error, or DSN failed

ORIGINAL, MDN, DSN = "IMF", "MDN", "DSN"
_TYPES = {"imf": ORIGINAL, "mdn": MDN, "dsn": DSN, "IMF": ORIGINAL, "MDN": MDN, "DSN": DSN}


# A recipient is complete when its bits hold all of the first mask or any of the second.
TIMELY_NEEDS = (PROCESSED | DISPATCHED, FAILED)
GENERAL_NEEDS = (NOTICE, 0)


def normal_address(text: str) -> str:
    """Trimmed, without an address-type prefix such as ``rfc822;``."""
    cut = text.find(";")
    return (text[cut + 1:] if cut >= 0 else text).strip()


def reader(path: FieldPath) -> Callable[[Mapping[str, Any]], Any]:
    """``path.get``; a one-part path (the usual case) becomes one C-level lookup,
    which keeps the per-message cost low. Both raise a KeyError when the field
    is missing (MissingField is one)."""
    return itemgetter(path.parts[0]) if len(path.parts) == 1 else path.get


def missing(exc: KeyError) -> str:
    """The failure reason for a missing field."""
    return str(exc) if isinstance(exc, MissingField) else f"message has no field '{exc.args[0]}'"


def addresses(value: Any, path: FieldPath) -> list[str]:
    """The normalised addresses in a text (comma-separated) or a list of texts."""
    if isinstance(value, str):
        parts: list = value.split(",")
    elif isinstance(value, list) and all(isinstance(v, str) for v in value):
        parts = value
    else:
        raise BadInput(f"field '{path.path}' must be a text or a list of texts (got {value!r:.60})")
    found = [a for a in map(normal_address, parts) if a]
    if not found:
        raise BadInput(f"field '{path.path}' names no recipient")
    return found


def lowered(value: Any, path: FieldPath, expected: str = "a text or a list of texts") -> str:
    """A text or a list of texts, lower-cased, for case-insensitive matching."""
    if isinstance(value, str):
        return value.lower()
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return ",".join(value).lower()
    raise BadInput(f"field '{path.path}' must be {expected} (got {value!r:.60})")


def correlation(value: Any, path: FieldPath) -> str:
    """A group key: a non-empty text, or an integer as text."""
    if isinstance(value, str) and value:
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise BadInput(f"field '{path.path}' must be a non-empty text or an integer (got {value!r:.60})")


@dataclass(frozen=True)
class Fields:
    """Where the node reads each value in a message (field paths)."""

    type: FieldPath = FieldPath("type")                        # IMF, MDN or DSN
    message_id: FieldPath = FieldPath("id")                    # original: its own message ID
    parent_id: FieldPath = FieldPath("parent_id")              # notification: the original it answers
    recipients: FieldPath = FieldPath("recipients")            # original: its recipients
    final_recipient: FieldPath = FieldPath("final_recipient")  # notification: the recipient(s) it names
    disposition: FieldPath = FieldPath("disposition")          # MDN: processed, dispatched, denied, error
    options: FieldPath = FieldPath("disposition_options")      # MDN: disposition options
    action: FieldPath = FieldPath("action")                    # DSN: failed, delayed, delivered, ...
    timely: FieldPath = FieldPath("disposition_options")       # original: requests timely and reliable


class Group(Timed):
    """One original's messages and what the notifications said so far; its time-out is ``due``."""

    __slots__ = ("start", "msgs", "recipients", "requested", "needs", "bits", "incomplete")

    def __init__(self, key: str, start: float):
        super().__init__(key)
        self.start = start
        self.msgs: list[Msg] = []
        self.recipients: tuple[str, ...] | None = None  # None until the original arrives
        self.requested = False  # the original asked for timely and reliable delivery
        self.needs = TIMELY_NEEDS  # the group's completion rule; set by its original
        self.bits: dict[str, int] = {}
        self.incomplete: set[str] = set()


class Aggregate(Node):
    """Correlates originals with their MDNs and DSNs; see the module docstring."""

    kind = "aggregate"
    outlinks = ("complete", "timeout", "orphan", "failure")

    def __init__(self, name: str, *, completion: str = "variable",
                 timeout: float | Mapping[str, float], fields: Fields = Fields()):
        super().__init__(name)
        if completion not in RULES:
            raise ValueError(f"completion must be one of {', '.join(RULES)}")
        if isinstance(timeout, Mapping):
            self._timely_timeout = float(timeout["timely_and_reliable"])
            self._general_timeout = float(timeout["general"])
        else:
            self._timely_timeout = self._general_timeout = float(timeout)
        if min(self._timely_timeout, self._general_timeout) <= 0:
            raise ValueError("timeouts must be > 0")
        self.completion = completion
        self.fields = fields
        # self._read_type, self._read_message_id, ...: one reader per field.
        for field in Fields.__dataclass_fields__:
            setattr(self, f"_read_{field}", reader(getattr(fields, field)))
        self._reads_flag = completion == "variable" or isinstance(timeout, Mapping)
        # Under the general rule alone, dispositions and actions change nothing,
        # so a notification need not carry them.
        self._reads_details = completion != "general"
        self._groups: dict[str, Group] = {}
        self._timers = GroupTimers(self._groups.get)
        self._held = 0
        self._changed: set[str] = set()

    # -- state per group (see base) ---------------------------------------------
    def changed_state(self) -> dict:
        changed, self._changed = self._changed, set()
        groups = self._groups
        return {key: self._entry(groups[key]) if key in groups else None for key in changed}

    @staticmethod
    def _entry(g: Group) -> dict:
        return timed_entry(g, {
            "start": g.start, "msgs": [msg_json(m) for m in g.msgs], "recipients": g.recipients,
            "requested": g.requested, "timely": g.needs is TIMELY_NEEDS, "bits": g.bits,
            "incomplete": sorted(g.incomplete)})

    def load_state(self, entries) -> None:
        # Group keys are texts, kept as they are; deadlines are set again in the order they were set.
        for key, e in sorted(entries.items(), key=lambda kv: (kv[1].get("d", 0.0), kv[1].get("s", 0))):
            g = self._groups[key] = Group(key, e["start"])
            g.msgs = [msg_from_json(m) for m in e["msgs"]]
            g.recipients = tuple(e["recipients"]) if e["recipients"] is not None else None
            g.requested, g.needs = e["requested"], TIMELY_NEEDS if e["timely"] else GENERAL_NEEDS
            g.bits, g.incomplete = dict(e["bits"]), set(e["incomplete"])
            self._held += len(g.msgs)
            restore_timer(self._timers, g, e)

    # -- the Node contract -------------------------------------------------
    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        doc = msg.doc
        try:
            value = self._read_type(doc)
            kind = _TYPES.get(value) if type(value) is str else None
            if kind is None:
                kind = self._kind(value)
            if kind is ORIGINAL:
                key, recipients, requested = self._read_original(doc)
            else:
                key, named, bits = self._read_notice(kind, doc)
        except BadInput as bad:
            return [Emit("failure", (msg,), {"reason": str(bad)})]
        except KeyError as exc:
            return [Emit("failure", (msg,), {"reason": missing(exc)})]
        group = self._groups.get(key)
        self._changed.add(key)
        if group is None:
            group = self._open(key, now)
        elif kind is ORIGINAL and group.recipients is not None:
            return [Emit("failure", (msg,), {"reason": f"group '{key}' already has its original message"})]
        group.msgs.append(msg)
        self._held += 1
        if kind is ORIGINAL:
            self._set_original(group, recipients, requested)
        else:
            self._note(group, named, bits)
        if group.recipients is not None and not group.incomplete:
            return [self._close(group, "complete", {"group": key, "rule": self._rule(group)})]
        # The decaying timeout: remaining = timeout - (now - start), floored at
        # 1 ms, i.e. the deadline stays at start + timeout unless that has passed.
        timeout = self._timely_timeout if group.requested else self._general_timeout
        deadline = max(group.start + timeout, now + FLOOR)
        if deadline != group.due:
            self._timers.set(group, deadline)
        return []

    def on_time(self, now: float) -> list[Emit]:
        out = []
        while (fired := self._timers.pop(now)) is not None:
            group = fired[1]
            self._changed.add(group.key)
            out.append(self._expire(group))
        return out

    def next_deadline(self) -> float | None:
        return self._timers.next()

    def pending(self) -> int:
        return self._held

    def groups(self) -> int:
        """How many groups are open."""
        return len(self._groups)

    def pending_counts(self) -> dict[str, int]:
        return {"held": self._held, "groups": len(self._groups)}

    # -- reading a message (raise BadInput or KeyError, change nothing) ---------
    def _kind(self, value: Any) -> str:
        """The slow path of the message type: other spellings, or a bad value."""
        kind = _TYPES.get(value.strip().lower()) if isinstance(value, str) else None
        if kind is None:
            raise BadInput(f"field '{self.fields.type.path}' must be IMF, MDN or DSN (got {value!r:.60})")
        return kind

    def _read_original(self, doc: Mapping[str, Any]) -> tuple[str, tuple[str, ...], bool]:
        f = self.fields
        key = self._read_message_id(doc)
        if type(key) is not str or not key:
            key = correlation(key, f.message_id)
        # dict.fromkeys: drop repeated addresses, keep the original's order.
        recipients = tuple(dict.fromkeys(addresses(self._read_recipients(doc), f.recipients)))
        requested = False
        if self._reads_flag:
            try:
                flag = self._read_timely(doc)
            except KeyError:
                flag = False  # as in Direct: no option, no timely-and-reliable request
            if isinstance(flag, bool):
                requested = flag
            else:
                requested = TIMELY_OPTION in lowered(flag, f.timely, "true, false, a text or a list of texts")
        return key, recipients, requested

    def _read_notice(self, kind: str, doc: Mapping[str, Any]) -> tuple[str, list[str], int]:
        f = self.fields
        key = self._read_parent_id(doc)
        if type(key) is not str or not key:
            key = correlation(key, f.parent_id)
        value = self._read_final_recipient(doc)
        address = normal_address(value) if type(value) is str and "," not in value else ""  # the usual case
        named = [address] if address else addresses(value, f.final_recipient)
        if not self._reads_details:
            return key, named, NOTICE
        if kind is DSN:
            action = self._read_action(doc)
            action = action.lower() if type(action) is str else lowered(action, f.action)
            return key, named, NOTICE | FAILED if "failed" in action else NOTICE
        # Direct's order: a disposition naming several words counts as the first found.
        disposition = self._read_disposition(doc)
        disposition = disposition.lower() if type(disposition) is str else lowered(disposition, f.disposition)
        if "processed" in disposition:
            return key, named, NOTICE | PROCESSED
        if "dispatched" in disposition:
            try:
                confirmed = TIMELY_OPTION in lowered(self._read_options(doc), f.options)
            except KeyError:
                confirmed = False
            return key, named, NOTICE | DISPATCHED if confirmed else NOTICE
        if "denied" in disposition or "error" in disposition:
            return key, named, NOTICE | FAILED
        return key, named, NOTICE

    # -- group state ---------------------------------------------------------
    def _open(self, key: str, now: float) -> Group:
        group = self._groups[key] = Group(key, now)
        return group

    def _set_original(self, group: Group, recipients: tuple[str, ...], requested: bool) -> None:
        group.recipients, group.requested = recipients, requested
        timely = requested if self.completion == "variable" else self.completion == "timely_and_reliable"
        group.needs = every, some = TIMELY_NEEDS if timely else GENERAL_NEEDS
        bits = group.bits  # from notifications that came before the original
        group.incomplete = {r for r in recipients if bits.get(r, 0) & every != every and not bits.get(r, 0) & some} \
            if bits else set(recipients)

    def _note(self, group: Group, named: list[str], new: int) -> None:
        seen, incomplete = group.bits, group.incomplete
        every, some = group.needs
        for address in named:
            bits = seen[address] = seen.get(address, 0) | new
            # Before the original, incomplete is empty: the bits wait for it.
            if address in incomplete and (bits & every == every or bits & some):
                incomplete.discard(address)

    @staticmethod
    def _rule(group: Group) -> str:
        return "timely_and_reliable" if group.needs is TIMELY_NEEDS else "general"

    def _expire(self, group: Group) -> Emit:
        if group.recipients is None:
            return self._close(group, "orphan", {"group": group.key, "reason": "no original message arrived in time"})
        incomplete = [r for r in group.recipients if r in group.incomplete]
        return self._close(group, "timeout", {"group": group.key, "rule": self._rule(group), "incomplete": incomplete})

    def _close(self, group: Group, outlink: str, info: dict) -> Emit:
        del self._groups[group.key]
        self._timers.cancel(group)
        self._held -= len(group.msgs)
        return Emit(outlink, tuple(group.msgs), info)


def build(name: str, p: Params) -> Aggregate:
    """An :class:`Aggregate` from a flow file's node parameters."""
    p.only("completion", "timeout", "fields")
    completion = p.choice("completion", RULES, "variable")
    timeout: float | dict[str, float]
    if isinstance(p.value.get("timeout"), dict):
        t = p.section("timeout").only("timely_and_reliable", "general")
        timeout = {k: t.seconds(k, positive=True) for k in ("timely_and_reliable", "general")}
    else:
        timeout = p.seconds("timeout", positive=True)
    f = p.section("fields", {}).only(*Fields.__dataclass_fields__)
    # A field the chosen rules never read is refused: it would pass for a setting.
    unread = {"timely": completion != "variable" and not isinstance(timeout, dict),
              "disposition": completion == "general", "options": completion == "general",
              "action": completion == "general"}
    for k, skip in unread.items():
        if skip and f.has(k):
            raise f.error(k, "is never read with these completion and timeout settings")
    fields = Fields(**{k: f.field_path(k) for k in Fields.__dataclass_fields__ if f.has(k)})
    return Aggregate(name, completion=completion, timeout=timeout, fields=fields)
