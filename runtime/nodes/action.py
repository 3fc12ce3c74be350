"""The ActionNode: hands each message to a handler, retrying transient errors (as webMethods trigger services do).

The handler is a Python callable named in the flow file
(``package.module:function``) taking one :class:`Msg`. When it returns, the
message leaves through ``done``. When it raises the transient error type
(``TransientError`` by default, or the exception class named by
``transient``), the message waits ``retry_interval`` seconds and the handler
runs again with the original message, up to ``max_retries`` retries; then the
last failure counts as a service error. A service error (any other exception,
or retries used up) sends the message to ``error`` with the reason. Without a
handler the node delivers nothing itself: every message leaves through
``done`` (replay uses this to show what would be delivered). On the
cluster, what leaves through ``done`` is written to the ``sink`` stream.

The handler receives the message (``msg.id``, ``msg.doc``) and, when it
declares a parameter named ``attempt``, the attempt number (1 for the first
call, 2 for the first retry, and so on). Its return value is ignored: it
fails by raising. On the cluster a handler runs at least once per message:
a master that dies after the call and before its step is committed leaves
the message to its successor, which calls it again, unless a history node
with ``completion: external`` guards it (the successor finds it In Doubt).

Retry failure (``on_retry_failure``): ``error`` (the default) sends the
message to ``error``; ``suspend`` (webMethods' "suspend and retry later")
keeps it and suspends the node for ``suspend_for`` seconds: every message
that reaches the node meanwhile waits behind it, in order, and when the time
is up (or ``resume`` is called: ``twinflow resume`` on the cluster) the
suspended message runs first, with its retries anew, then the others.
``suspension()`` says whether, why and since when the node is suspended; on
the cluster a suspended flow stops reading its uplink on every peer.

Guarded attempts. Behind a history with external completion
(``runtime/nodes/history.py``), the first attempt of a message is guarded by
the history's "processing" entry; the attempts the node makes later from
its state (a retry, the end of a suspension, a message waiting behind one)
are guarded here: ``attempt_started`` (set by the cluster's master) writes a
marker to Redis before the handler runs, and the step that ran the attempt
removes it. A marker loaded with the state means a master died inside that
attempt: before running it again the node asks ``decide_doubt`` (the
history's resolver, wired by the engine). Duplicate: the message leaves by
``done`` (the handler's effect is there); New: it runs again; no resolver,
or any other answer: it leaves by ``error`` with the reason, so no handler
call is ever repeated outside an In Doubt decision. A resubmitted message
(``on_resubmit``, an operator's ``twinflow failures resubmit``) is guarded
the same way, its marker named by the resubmit (``resubmit:<token>``): a
master that dies inside its call leaves the marker, and the resubmit, read
again from the uplink, asks the resolver first.

The node holds a message only while it waits for a retry or behind a
suspension; retries fire from ``on_time`` in deadline order, so they happen
with no new input.

>>> calls = []
>>> def flaky(msg):
...     calls.append(msg.id)
...     if len(calls) < 2:
...         raise TransientError("database busy")
>>> node = ActionNode("deliver", handler=flaky, retry_interval=1.0, max_retries=3)
>>> node.on_message(Msg("m1", {}), now=0.0)
[]
>>> [(e.outlink, e.msgs[0].id) for e in node.on_time(1.0)]
[('done', 'm1')]
"""

from __future__ import annotations

import inspect
import itertools
from typing import Callable

from ..params import Params
from .base import Emit, Msg, Node, msg_from_json, msg_json
from .deadlines import GroupTimers, Timed


class TransientError(Exception):
    """Raised by a handler for an error that may correct itself (network, database busy)."""


RETRY_FAILURES = ("error", "suspend")
ATTEMPT_PREFIX = "attempt:"  # a state key: an attempt made from the state, marked before its handler ran
RESUBMIT_PREFIX = "resubmit:"  # a state key: a resubmitted message's attempt, marked before its handler ran
DOUBTED = "an attempt of this message was under way when its master died"
DEFAULT_SUSPEND_FOR = 60.0


class _Retry(Timed):
    """A message waiting for its next attempt (its time is ``due``); with a ``reason``, the
    message the node is suspended on (``since``: when its retries were used up)."""

    __slots__ = ("msg", "retries", "reason", "since")

    def __init__(self, order: int, msg: Msg, retries: int, reason: str | None = None, since: float = 0.0):
        super().__init__(order)
        self.msg, self.retries, self.reason, self.since = msg, retries, reason, since


class ActionNode(Node):
    kind = "action"
    outlinks = ("done", "error", "failure")

    def __init__(
        self,
        name: str,
        handler: Callable[..., object] | None = None,
        transient: type[BaseException] = TransientError,
        retry_interval: float = 1.0,
        max_retries: int = 3,
        sink: str | None = None,
        on_retry_failure: str = "error",
        suspend_for: float = DEFAULT_SUSPEND_FOR,
    ):
        super().__init__(name)
        if on_retry_failure not in RETRY_FAILURES:
            raise ValueError(f"on_retry_failure must be one of {', '.join(RETRY_FAILURES)} (got {on_retry_failure!r})")
        if not suspend_for > 0:
            raise ValueError(f"suspend_for must be > 0 seconds (got {suspend_for!r})")
        self.sink = sink  # on the cluster, the stream ``done`` leaves to (replay shows it)
        self.handler = handler
        self._attempt_arg = _takes_attempt(handler)
        self.transient = transient
        self.retry_interval = retry_interval
        self.max_retries = max_retries
        self.suspends = on_retry_failure == "suspend"
        self.suspend_for = float(suspend_for)
        self.sets_deadlines_after_now = retry_interval > 0  # a retry waits now + retry_interval
        self._waiting: dict[int, _Retry] = {}  # arrival order -> a message waiting for its retry
        self._timers = GroupTimers(self._waiting.get)
        self._order = itertools.count()
        self._changed: dict[str, list | None] = {}
        self._suspended: _Retry | None = None  # the message the node is suspended on
        # After a suspension: the order of its message while that message is still in its
        # retries; the messages behind wait until it has left (done or error).
        self._head: int | None = None
        self._behind: dict[int, Msg] = {}  # arrival order -> a message waiting behind the suspension
        # Guarded attempts (see the module doc): set by the cluster's master and the engine.
        self.attempt_started: Callable[[str, float], None] | None = None
        self.decide_doubt: Callable[[Msg, float], str | None] | None = None
        self._doubted: set[int] = set()  # orders whose attempt marker was loaded: a master died inside it
        self._doubted_resubmits: set[str] = set()  # resubmits whose marker was loaded: likewise
        self._unstart: set[str] = set()  # attempt markers the next changes remove

    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        if self._blocked():
            self._wait_behind(next(self._order), msg)
            return []
        return self._run(msg, 0, now, next(self._order))

    def on_resubmit(self, msg: Msg, now: float, token: str) -> list[Emit]:
        """A resubmitted message (``token`` names the resubmit): as ``on_message``, guarded behind a
        history like an attempt from the state (see the module doc)."""
        if self.attempt_started is None or self._blocked():
            return self.on_message(msg, now)
        decided = self._marked(RESUBMIT_PREFIX + token, token, self._doubted_resubmits, msg, now)
        return decided if decided is not None else self._run(msg, 0, now, next(self._order))

    def _marked(self, marker: str, key, doubted: set, msg: Msg, now: float) -> list[Emit] | None:
        """Before a guarded attempt: a doubted one (``key`` in ``doubted``: its marker was loaded)
        asks the resolver first, whose answer may end it here (returned); otherwise the marker is
        written to Redis (the step that runs the attempt removes it) and None lets it run."""
        if key in doubted:
            doubted.discard(key)
            self._unstart.add(marker)
            decided = self._decide(msg, now)
            if decided is not None:
                return decided
        self.attempt_started(marker, now)
        self._unstart.add(marker)
        return None

    def _decide(self, msg: Msg, now: float) -> list[Emit] | None:
        """A doubted attempt: the resolver's answer as emissions, or None to run it again."""
        verdict = self.decide_doubt(msg, now) if self.decide_doubt is not None else None
        if verdict == "duplicate":
            return [Emit("done", (msg,), {"reason": DOUBTED, "resolver": verdict})]
        if verdict == "new":
            return None
        why = "no resolver" if self.decide_doubt is None or verdict is None else f"resolver answered {verdict!r}"
        return [Emit("error", (msg,), {"reason": f"{DOUBTED} ({why})"})]

    def on_time(self, now: float) -> list[Emit]:
        out: list[Emit] = []
        while (fired := self._timers.pop(now)) is not None:
            due, waiting = fired
            del self._waiting[waiting.key]
            self._changed[str(waiting.key)] = None
            if waiting is self._suspended:
                out += self._resume_at(due)
            elif self._blocked() and waiting.key != self._head:
                self._wait_behind(waiting.key, waiting.msg)  # its retry comes after the suspension
            else:
                out += self._run(waiting.msg, waiting.retries, due, waiting.key, from_state=True)
        return out

    # -- suspension --------------------------------------------------------
    def suspension(self) -> dict | None:
        """Why and since when the node is suspended, and when it resumes by itself; None: it is not."""
        s = self._suspended
        if s is None:
            return None
        return {"node": self.name, "id": s.msg.id, "reason": s.reason, "since": s.since, "until": s.due,
                "behind": len(self._behind)}

    def resume(self, now: float) -> bool:
        """End the suspension at ``now`` (the next ``on_time(now)`` runs the message); False when
        the node is not suspended."""
        s = self._suspended
        if s is None:
            return False
        self._timers.set(s, min(s.due, now))
        self._changed[str(s.key)] = self._entry(s)
        return True

    def _blocked(self) -> bool:
        return self._suspended is not None or self._head is not None

    def _resume_at(self, due: float) -> list[Emit]:
        """The suspension is over: its message runs first, with its retries anew."""
        s, self._suspended = self._suspended, None
        self._head = s.key
        return self._run(s.msg, 0, due, s.key, from_state=True)

    def _run(self, msg: Msg, retries: int, now: float, order: int, from_state: bool = False) -> list[Emit]:
        """An attempt (``from_state``: one made from the node's state, guarded when the node is);
        once the message a suspension ended on has left, those behind it run, in order, until one
        suspends the node again."""
        out = self._guarded(msg, retries, now, order) if from_state and self.attempt_started is not None \
            else self._attempt(msg, retries, now, order)
        if order != self._head:
            return out
        waiting = self._waiting.get(order)
        if waiting is not None and waiting.reason is None:
            return out  # still in its retries
        self._head = None
        if waiting is None:
            for behind in sorted(self._behind):
                if self._blocked():
                    break
                msg = self._behind.pop(behind)
                self._changed["q" + str(behind)] = None
                out += self._run(msg, 0, now, behind, from_state=True)
        return out

    def _guarded(self, msg: Msg, retries: int, now: float, order: int) -> list[Emit]:
        """An attempt made from the state behind a guarding history: its marker in Redis first; an
        attempt a dead master may have made is decided by the history's resolver first."""
        decided = self._marked(ATTEMPT_PREFIX + str(order), order, self._doubted, msg, now)
        return decided if decided is not None else self._attempt(msg, retries, now, order)

    def _wait_behind(self, order: int, msg: Msg) -> None:
        self._behind[order] = msg
        self._changed["q" + str(order)] = [msg_json(msg)]

    # -- state per waiting retry (see base) ----------------------------------
    def changed_state(self) -> dict:
        changed, self._changed = self._changed, {}
        if self._unstart:
            changed.update(dict.fromkeys(self._unstart))
            self._unstart = set()
        return changed

    def load_state(self, entries) -> None:
        resubmits = {k for k in entries if k.startswith(RESUBMIT_PREFIX)}
        self._doubted_resubmits.update(k[len(RESUBMIT_PREFIX):] for k in resubmits)
        entries = {k: v for k, v in entries.items() if k not in resubmits}
        markers = {k for k in entries if k.startswith(ATTEMPT_PREFIX)}
        behind = {k: v for k, v in entries.items() if k.startswith("q")}
        timed = {k: v for k, v in entries.items() if not k.startswith("q") and k not in markers}
        for key, value in sorted(timed.items(), key=lambda kv: (kv[1][0], int(kv[0]))):
            due, msg, retries = value[:3]
            waiting = self._waiting[int(key)] = _Retry(int(key), msg_from_json(msg), retries, *value[3:])
            if waiting.reason is not None:
                self._suspended = waiting
            elif len(value) > 3:
                self._head = waiting.key
            self._timers.set(waiting, due)
        for key, (msg,) in behind.items():
            self._behind[int(key[1:])] = msg_from_json(msg)
        for marker in markers:  # an attempt that was running when its master died
            order = int(marker[len(ATTEMPT_PREFIX):])
            if order in self._waiting or order in self._behind:
                self._doubted.add(order)
            else:
                self._unstart.add(marker)
        self._order = itertools.count(max((int(k.lstrip("q")) for k in entries if k not in markers), default=-1) + 1)

    def next_deadline(self) -> float | None:
        return self._timers.next()

    def pending(self) -> int:
        return len(self._waiting) + len(self._behind)

    def pending_counts(self) -> dict[str, int]:
        """``retries``: messages waiting for a retry; ``behind``: messages waiting behind a suspension."""
        return {"held": len(self._waiting) + len(self._behind), "retries": len(self._waiting),
                "behind": len(self._behind)}

    def _entry(self, w: _Retry) -> list:
        """[due, message, retries], then [reason, since] for a suspension, [None] for the head."""
        entry = [w.due, msg_json(w.msg), w.retries]
        if w.reason is not None:
            return entry + [w.reason, w.since]
        return entry + [None] if w.key == self._head else entry

    def _wait(self, waiting: _Retry, due: float) -> None:
        self._waiting[waiting.key] = waiting
        self._timers.set(waiting, due)
        self._changed[str(waiting.key)] = self._entry(waiting)

    def _attempt(self, msg: Msg, retries: int, now: float, order: int) -> list[Emit]:
        if self.handler is None:
            return [Emit("done", (msg,))]
        try:
            if self._attempt_arg:
                self.handler(msg, attempt=retries + 1)
            else:
                self.handler(msg)
        except self.transient as exc:
            if retries < self.max_retries:
                self._wait(_Retry(order, msg, retries + 1), now + self.retry_interval)
                return []
            reason = f"service error after {retries} retries: {type(exc).__name__}: {exc}"[:500]
            if self.suspends:
                self._suspended = _Retry(order, msg, 0, reason, now)
                self._wait(self._suspended, now + self.suspend_for)
                return []
            return [Emit("error", (msg,), {"reason": reason})]
        except Exception as exc:  # a service error: the handler failed for good
            return [Emit("error", (msg,), {"reason": f"service error: {type(exc).__name__}: {exc}"[:500]})]
        return [Emit("done", (msg,))]


def _takes_attempt(handler: Callable | None) -> bool:
    """Whether ``handler`` declares a parameter named ``attempt`` (it is then passed by name)."""
    if handler is None:
        return False
    try:
        params = inspect.signature(handler).parameters
    except (TypeError, ValueError):  # a builtin without a signature: it takes the message only
        return False
    return "attempt" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())


def build(name: str, p: Params) -> ActionNode:
    p.only("handler", "transient", "retry_interval", "max_retries", "sink", "on_retry_failure", "suspend_for")
    transient = p.callable("transient", TransientError)
    if not (isinstance(transient, type) and issubclass(transient, BaseException)):
        raise p.error("transient", "must name an exception class")
    return ActionNode(
        name,
        handler=p.callable("handler", None),
        transient=transient,
        retry_interval=p.seconds("retry_interval", 1.0),
        max_retries=p.integer("max_retries", 3, minimum=0),
        sink=p.section("sink").only("stream").name("stream") if p.has("sink") else None,
        on_retry_failure=p.choice("on_retry_failure", RETRY_FAILURES, "error"),
        suspend_for=p.seconds("suspend_for", DEFAULT_SUSPEND_FOR, positive=True),
    )
