"""The history node: an exactly-once guard with a document history (after webMethods Integration Server).

Every message is identified by its flow trigger and its UUID (the ``uuid``
field, or the message ID when that field is absent, null or empty). The
history holds, per identifier, a "processing" entry and a "completed" entry
that share one timestamp, and the verdict follows Integration Server's table:

    history holds                        verdict     outlink
    -----------------------------------  ----------  ---------------------------
    nothing                              New         new
    "processing" and "completed"         Duplicate   duplicate
    "completed" only                     Duplicate   duplicate
    "processing" only                    In Doubt    resolver, else in_doubt
    (any, with a UUID over 96 chars)     In Doubt    resolver, else in_doubt

A New message is recorded "processing" when it leaves through ``new`` (the
downstream runs after that) and "completed", with the same timestamp, when
the downstream has finished, success or failure. With ``completion =
"immediate"`` (the default) the node records both at once; with
``"external"`` the engine reports the end: when a message that left through
``new`` leaves the flow from a node downstream of it (an action's ``done``
or ``error``, say), the engine calls :meth:`HistoryNode.finished`. On the
cluster the "processing" entry of an external completion is in Redis before
the downstream runs (``started``, set by the master), so a peer that dies
inside the handler leaves the message In Doubt for whoever runs it next.

A "processing" entry alone is In Doubt, as Integration Server has it: the
run that wrote it "might still be executing or the server might have
unexpectedly shut down". The verdict's ``reason`` says which one the node
knows. When the engine reports completion (``tracked``: something in the
flow is linked to ``new``), the run is under way (``IN_PROGRESS``: the step
that ran it was committed, and the message waits downstream, for a retry,
behind a suspension, in an open join), unless the entry was loaded from
``started`` and its step never committed (``MASTER_DIED``: the master died
inside the handler; ``started`` writes the entry under a key of its own,
``STARTED_PREFIX``, which the step that runs the message removes). Without
tracking the node knows neither (``NOT_COMPLETED``).

An optional resolver decides In Doubt messages, told the reason: ``new``
(recorded and run again) or ``duplicate`` (recorded as completed, so the
message is never In Doubt again). Without a resolver the message leaves
through ``in_doubt``: a handler still running is never run a second time
unless the resolver says so. A resolver that raises, or answers anything
else, sends the message to ``failure`` with the reason. Both entries of an
identifier are cleared together ``retention`` seconds after their timestamp;
the message is New again. Every Duplicate and In Doubt verdict is also a
journal entry (``journal``, when the caller sets it to a list: the cluster
logs each one), an In Doubt one with the reason and, when a resolver decided
it, its answer.

A resolver's ``new`` for a run under way starts a second run while the first
may still report its end. The second run's entry has a time of its own, so
the first run's report does not complete it; on a new master (which does not
know which message ID ran when) the message ID of the second run is kept as
state (``RERUN_PREFIX``) until that run completes, and a report by any other
message ID records nothing.

Under bad input: a ``uuid`` that is not a string, or a message with neither a
UUID nor a message ID, leaves through ``failure`` with ``info["reason"]``;
the node keeps running. Every message leaves at once, through exactly one
outlink, so the node never holds messages (``pending()`` is 0); its state is
the history, bounded by the distinct identifiers seen within ``retention``.
On the cluster each identifier's entries are one state entry in Redis (see
base).

>>> node = HistoryNode("guard", retention=60.0)
>>> [e.outlink for e in node.on_message(Msg("m1", {"uuid": "order-1"}), now=0.0)]
['new']
>>> [e.outlink for e in node.on_message(Msg("m2", {"uuid": "order-1"}), now=1.0)]
['duplicate']
>>> [e.outlink for e in node.on_message(Msg("m3", {"uuid": "order-1"}), now=60.0)]
['new']
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from ..fields import BadInput, FieldPath, MissingField
from ..json_text import key_text, loads
from ..params import Params
from .base import Emit, Msg, Node
from .history_store import COMPLETED, PROCESSING, Entry, HistoryStore, Key, MemoryHistoryStore

__all__ = ["COMPLETED", "PROCESSING", "Doubt", "Entry", "HistoryNode", "HistoryStore", "MemoryHistoryStore",
           "build"]

NEW, DUPLICATE, IN_DOUBT, FAILURE = "new", "duplicate", "in_doubt", "failure"
COMPLETIONS = ("immediate", "external")
MAX_UUID_LENGTH = 96
DEFAULT_RETENTION = 7200.0  # Integration Server's default history time to live: 2 hours

BOTH_ENTRIES = "processing and completed entries exist"
COMPLETED_ONLY = "completed entry exists"
NOT_COMPLETED = "processing entry without a completed entry"
TOO_LONG = f"uuid longer than {MAX_UUID_LENGTH} characters"
IN_PROGRESS = "processing entry of a run still in progress"
MASTER_DIED = "processing entry of a run whose master died inside it"
ATTEMPT_IN_DOUBT = "an attempt downstream was under way when its master died"
STARTED_PREFIX = "started:"  # a state key: the "processing" entry a master wrote before its handler ran
RERUN_PREFIX = "rerun:"  # a state key: the message ID of a run a resolver started over a run under way

@dataclass(frozen=True, slots=True)
class Doubt:
    """What a resolver is told about an In Doubt message.

    ``started`` is the time of the "processing" entry (None when the UUID is
    too long to be looked up); ``reason`` is why the node could not decide:
    ``IN_PROGRESS`` (a run is under way: its handler may be running now),
    ``MASTER_DIED`` (the master of the run died inside it), ``NOT_COMPLETED``
    (neither is known), ``TOO_LONG``, or, asked for an action's attempt,
    ``ATTEMPT_IN_DOUBT``. A resolver that answers ``new`` to ``IN_PROGRESS``
    has the handler run a second time while the first run goes on.
    """

    trigger: str
    uuid: str
    reason: str
    started: float | None
    now: float


Resolver = Callable[[Msg, Doubt], str]


class HistoryNode(Node):
    sets_deadlines_after_now = True  # an entry's retention ends after now: retention is > 0

    """Exactly-once guard over a document history; see the module docstring."""

    kind = "history"
    outlinks = (NEW, DUPLICATE, IN_DOUBT, FAILURE)

    def __init__(
        self,
        name: str,
        *,
        retention: float = DEFAULT_RETENTION,
        uuid: FieldPath | None = None,
        trigger: str | None = None,
        resolver: Resolver | None = None,
        completion: str = "immediate",
        store: HistoryStore | None = None,
    ):
        super().__init__(name)
        if not retention > 0:
            raise ValueError(f"retention must be > 0 seconds (got {retention!r})")
        if completion not in COMPLETIONS:
            raise ValueError(f"completion must be one of {', '.join(COMPLETIONS)} (got {completion!r})")
        self.retention = float(retention)
        self.uuid_path = uuid if uuid is not None else FieldPath("uuid")
        self._top = self.uuid_path.parts[0] if len(self.uuid_path.parts) == 1 else None
        self.trigger = trigger if trigger is not None else name
        self.resolver = resolver
        self.external = completion == "external"
        self.state_in_redis = isinstance(store, (MemoryHistoryStore, type(None)))
        self.store: HistoryStore = store if store is not None else MemoryHistoryStore()
        # The history grows with the traffic (every identifier of the retention): the change log
        # carries it, so a worker keeps it loaded and a promotion need not read it whole. Not with
        # external completion: its "processing" entries reach Redis outside the steps (see
        # ``started``), so the log would miss them; a promotion reads that history whole.
        self.logs_state_changes = self.state_in_redis and not self.external
        # External completion on the cluster: called with (state key, time) when a "processing"
        # entry is recorded, before the message leaves for the downstream; it must not return
        # before the entry is in Redis (it raises when it cannot be written).
        self.started: Callable[[str, float], None] | None = None
        # Set by the engine when it reports completion (a node is linked to ``new``): then a
        # "processing" entry alone is a run in progress unless it was loaded from ``started``.
        self.tracked = False
        self._doubted: set[Key] = set()  # keys loaded from a started entry alone: their master died
        self._unstart: set[str] = set()  # started entries to remove with the next changes
        # Keys a resolver ran again while a run was under way -> the message ID of the new run
        # (state: a new master must not take the earlier run's report for the new run's).
        self._reruns: dict[Key, str] = {}
        self._reruns_changed: set[Key] = set()
        # When a list: every Duplicate and In Doubt verdict is appended to it, as a journal entry.
        self.journal: list[dict] | None = None
        # external completion only: message ID -> (key, started) of messages
        # sent to `new` and not reported completed, so completed() can take
        # the message ID; insertion order is time order, for O(1) expiry.
        self._open: OrderedDict[str, tuple[Key, float]] = OrderedDict()

    # -- the engine's calls -------------------------------------------------
    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        cutoff = self._expire(now)
        doc = msg.doc
        # The usual case (a top-level string in a dict) inline: FieldPath's
        # general walk would cost more than all the rest of the node does.
        uuid = doc.get(self._top) if self._top is not None and type(doc) is dict else None
        if type(uuid) is not str or not uuid:
            try:
                uuid = self._identify(msg)
            except BadInput as exc:
                return [Emit(FAILURE, (msg,), {"reason": str(exc)})]
        if len(uuid) > MAX_UUID_LENGTH:
            return self._doubt(msg, uuid, TOO_LONG, None, now)
        key = (self.trigger, uuid)
        entry = self.store.get(key)
        if entry is None or entry.time <= cutoff:
            return self._run(msg, key, now, {})
        if entry.completed:
            return self._verdict(DUPLICATE, msg, uuid, {"reason": BOTH_ENTRIES if entry.processing else COMPLETED_ONLY})
        return self._doubt(msg, uuid, self._unfinished(key), entry.time, now)

    def on_time(self, now: float) -> list[Emit]:
        self._expire(now)
        return []

    def next_deadline(self) -> float | None:
        """When the oldest entry's retention ends, rounded up to a whole second.

        Expiry emits nothing, and every call clears what expired before it
        decides, so the verdicts never depend on it. The deadline is there so
        that entries leave (on the cluster: leave Redis) with no new message,
        and the rounding lets one firing clear a second's worth of them.
        """
        oldest = self.store.oldest() if isinstance(self.store, MemoryHistoryStore) else None
        return None if oldest is None else float(math.ceil(oldest + self.retention))

    def pending(self) -> int:
        return 0

    def pending_counts(self) -> dict[str, int]:
        """``running``: with ``completion: external``, messages sent to ``new`` not reported completed yet."""
        return {"held": 0, "running": len(self._open)}

    # -- state per identifier (see base) -------------------------------------
    def changed_state(self) -> dict:
        changed = self.store.changed()
        if self._unstart:
            changed.update(dict.fromkeys(self._unstart))
            self._unstart = set()
        if self._reruns_changed:
            changed.update({RERUN_PREFIX + key_text(k): self._reruns.get(k) for k in self._reruns_changed})
            self._reruns_changed = set()
        return changed

    def load_state(self, entries) -> None:
        started = {k: v for k, v in entries.items() if k.startswith(STARTED_PREFIX)}
        reruns = {k: v for k, v in entries.items() if k.startswith(RERUN_PREFIX)}
        if started or reruns:
            entries = {k: v for k, v in entries.items()
                       if not k.startswith(STARTED_PREFIX) and not k.startswith(RERUN_PREFIX)}
        self.store.load(entries)
        for name, ident in reruns.items():
            key = tuple(loads(name[len(RERUN_PREFIX):]))
            if len(key) != 2 or not isinstance(ident, str):
                raise ValueError("a rerun history entry is not rerun:[trigger, uuid] -> message ID")
            self._reruns[key] = ident
        for name, time in started.items():
            text = name[len(STARTED_PREFIX):]
            key = tuple(loads(text))
            if len(key) != 2 or isinstance(time, bool) or not isinstance(time, (int, float)):
                raise ValueError("a started history entry is not started:[trigger, uuid] -> time")
            entry = self.store.get(key)
            if entry is not None and entry.time == time:  # its step committed (and will have removed it)
                self._unstart.add(name)
                continue
            # Its step never committed: whoever ran it died. In Doubt until decided (the started
            # entry stays in Redis until then, so a master that dies first leaves it In Doubt too).
            self.store.load({text: [float(time), True, False]})
            self._doubted.add(key)

    def apply_state(self, changes) -> None:
        self.store.apply(changes)

    def completed(self, ident: str, now: float) -> bool:
        """Record "completed" for a message sent to ``new``: the downstream has finished.

        ``ident`` is the message ID of that message, or its UUID (a message ID
        the node has open wins when both match). The entry takes the time of
        its "processing" entry. Returns False, recording nothing, when there
        is no open "processing" entry for it (unknown, expired, already
        completed, or superseded by a later run the resolver allowed).
        """
        opened = self._open.pop(ident, None)
        return self._complete(opened[0] if opened is not None else (self.trigger, ident), opened, now)

    def finished(self, msg: Msg, now: float) -> bool:
        """The engine's report that ``msg``, sent to ``new``, left the flow downstream: record
        "completed" as :meth:`completed` does. A message this process did not send (a master
        promoted while it waited for a retry) is found by its UUID."""
        opened = self._open.pop(msg.id, None)
        if opened is not None:
            return self._complete(opened[0], opened, now)
        try:
            uuid = self._identify(msg)
        except BadInput:
            return False
        if len(uuid) > MAX_UUID_LENGTH:
            return False
        key = (self.trigger, uuid)
        if self._reruns.get(key, msg.id) != msg.id:
            return False  # a run the resolver started over this one is still open: this report is not its end
        return self._complete(key, None, now)

    def decide(self, msg: Msg, now: float) -> str | None:
        """A node downstream asks: an attempt of ``msg`` (sent to ``new``) was under way when its
        master died. The resolver answers ``new`` (run it again) or ``duplicate`` (its effect is
        there); None: no resolver, or it raised or answered anything else. Journaled like an In Doubt."""
        if self.resolver is None:
            return None
        try:
            uuid = self._identify(msg)
        except BadInput:
            return None
        entry = self.store.get((self.trigger, uuid)) if len(uuid) <= MAX_UUID_LENGTH else None
        try:
            verdict = self.resolver(msg, Doubt(self.trigger, uuid, ATTEMPT_IN_DOUBT, entry.time if entry else None, now))
        except Exception:  # user code: the action sends the message to `error` with the reason
            return None
        if verdict not in (NEW, DUPLICATE):
            return None
        self._journal(msg, uuid, IN_DOUBT, {"reason": ATTEMPT_IN_DOUBT, "resolver": verdict})
        return verdict

    def _complete(self, key: Key, opened: tuple[Key, float] | None, now: float) -> bool:
        cutoff = self._expire(now)
        entry = self.store.get(key)
        if entry is None or entry.time <= cutoff or entry.completed or not entry.processing:
            return False
        if opened is not None and opened[1] != entry.time:
            return False  # a resolver ran the message again since: that run is still open
        self.store.put(key, COMPLETED, entry.time)
        self._rerun(key, None)
        return True

    # -- steps ------------------------------------------------------------
    def _expire(self, now: float) -> float:
        """Clear what is older than the retention; return the cutoff."""
        cutoff = now - self.retention
        self.store.clear_expired(cutoff)
        opened = self._open
        while opened and next(iter(opened.values()))[1] <= cutoff:
            opened.popitem(last=False)
        if self._doubted:
            for key in [k for k in self._doubted if self.store.get(k) is None]:
                self._settled(key)
        if self._reruns:
            for key in [k for k in self._reruns if self.store.get(k) is None]:
                self._rerun(key, None)
        return cutoff

    def _unfinished(self, key: Key) -> str:
        """Why a "processing" entry alone is In Doubt: its master died inside the run, the run is
        under way (the engine reports its end, and its step was committed), or neither is known."""
        if key in self._doubted:
            return MASTER_DIED
        return IN_PROGRESS if self.tracked else NOT_COMPLETED

    def _rerun(self, key: Key, ident: str | None) -> None:
        """Record (or, with None, forget) the message ID of the run a resolver started over a run under way."""
        if self._reruns.get(key) == ident:
            return
        if ident is None:
            del self._reruns[key]
        else:
            self._reruns[key] = ident
        self._reruns_changed.add(key)

    def _settled(self, key: Key) -> None:
        """A key loaded In Doubt was decided, run again or expired: its started entry goes."""
        self._doubted.discard(key)
        self._unstart.add(STARTED_PREFIX + key_text(key))

    def _identify(self, msg: Msg) -> str:
        try:
            uuid = self.uuid_path.get(msg.doc)
        except MissingField:
            uuid = None
        if uuid is None or uuid == "":
            if isinstance(msg.id, str) and msg.id:
                return msg.id  # Integration Server's fallback: the transport's message ID
            raise BadInput(f"message has no field '{self.uuid_path.path}' and no message ID")
        if not isinstance(uuid, str):
            raise BadInput(f"field '{self.uuid_path.path}' must be a string (got {type(uuid).__name__})")
        return uuid

    def _run(self, msg: Msg, key: Key, now: float, info: dict) -> list[Emit]:
        """A New message: "processing" before it leaves, "completed" after the downstream."""
        self.store.put(key, PROCESSING, now)
        if self.external:
            self._doubted.discard(key)
            # Over a run under way (the resolver's answer), that run may still report its end.
            self._rerun(key, msg.id if info.get("reason") == IN_PROGRESS else None)
            if self.started is not None:
                name = STARTED_PREFIX + key_text(key)
                self.started(name, now)
                self._unstart.add(name)  # the step that runs the message removes it
            self._open[msg.id] = (key, now)
            self._open.move_to_end(msg.id)
        else:
            self.store.put(key, COMPLETED, now)
        return [Emit(NEW, (msg,), info)]

    def _doubt(self, msg: Msg, uuid: str, reason: str, started: float | None, now: float) -> list[Emit]:
        if self.resolver is None:
            return self._verdict(IN_DOUBT, msg, uuid, {"reason": reason})
        try:
            verdict = self.resolver(msg, Doubt(self.trigger, uuid, reason, started, now))
        except Exception as exc:  # user code: whatever it raises, the message must still leave
            return [Emit(FAILURE, (msg,), {"reason": f"resolver raised {type(exc).__name__}: {exc}"[:500],
                                           "doubt": reason})]
        info = {"reason": reason, "resolver": verdict}
        if verdict == NEW:
            self._journal(msg, uuid, IN_DOUBT, info)
            if len(uuid) > MAX_UUID_LENGTH:
                # Too long to be a history key: not recorded, so the resolver
                # stays the only guard for this UUID.
                return [Emit(NEW, (msg,), info)]
            return self._run(msg, (self.trigger, uuid), now, info)
        if verdict == DUPLICATE:
            if started is not None:  # recorded: the message is a Duplicate from now on, never In Doubt again
                # A run under way reports its end later: the entry is completed, so that records nothing.
                key = (self.trigger, uuid)
                self.store.put(key, COMPLETED, started)
                self._rerun(key, None)
                if key in self._doubted:
                    self._settled(key)
            self._journal(msg, uuid, IN_DOUBT, info)
            return [Emit(DUPLICATE, (msg,), info)]
        return [Emit(FAILURE, (msg,), {
            "reason": f"resolver returned {verdict!r} (expected {NEW} or {DUPLICATE})"[:500], "doubt": reason})]

    def _verdict(self, outlink: str, msg: Msg, uuid: str, info: dict) -> list[Emit]:
        """A Duplicate or In Doubt verdict, with its journal entry when a journal is kept."""
        self._journal(msg, uuid, outlink, info)
        return [Emit(outlink, (msg,), info)]

    def _journal(self, msg: Msg, uuid: str, status: str, info: dict) -> None:
        """The journal entry of a verdict: an In Doubt one a resolver decided carries its answer."""
        if self.journal is not None:
            entry = {"node": self.name, "id": msg.id, "uuid": uuid, "status": status, "reason": info["reason"]}
            if "resolver" in info:
                entry["resolver"] = info["resolver"]
            self.journal.append(entry)


def build(name: str, p: Params, store: HistoryStore | None = None) -> HistoryNode:
    """The node from its flow-file parameters; the engine may pass a shared ``store``."""
    p.only("uuid", "trigger", "retention", "resolver", "completion")
    return HistoryNode(
        name,
        uuid=p.field_path("uuid", FieldPath("uuid")),
        trigger=p.name("trigger", name),
        retention=p.seconds("retention", DEFAULT_RETENTION, positive=True),
        resolver=p.callable("resolver", None),
        completion=p.choice("completion", COMPLETIONS, "immediate"),
        store=store,
    )
