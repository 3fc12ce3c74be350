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

The node holds a message only while it waits for a retry; retries fire from
``on_time`` in deadline order, so they happen with no new input.

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

import itertools
from typing import Callable

from ..params import Params
from .base import Emit, Msg, Node, msg_from_json, msg_json
from .deadlines import GroupTimers, Timed


class TransientError(Exception):
    """Raised by a handler for an error that may correct itself (network, database busy)."""


class _Retry(Timed):
    """A message waiting for its next attempt (its time is ``due``)."""

    __slots__ = ("msg", "retries")

    def __init__(self, order: int, msg: Msg, retries: int):
        super().__init__(order)
        self.msg, self.retries = msg, retries


class ActionNode(Node):
    kind = "action"
    outlinks = ("done", "error", "failure")

    def __init__(
        self,
        name: str,
        handler: Callable[[Msg], object] | None = None,
        transient: type[BaseException] = TransientError,
        retry_interval: float = 1.0,
        max_retries: int = 3,
        sink: str | None = None,
    ):
        super().__init__(name)
        self.sink = sink  # on the cluster, the stream ``done`` leaves to (replay shows it)
        self.handler = handler
        self.transient = transient
        self.retry_interval = retry_interval
        self.max_retries = max_retries
        self.sets_deadlines_after_now = retry_interval > 0  # a retry waits now + retry_interval
        self._waiting: dict[int, _Retry] = {}  # arrival order -> a message waiting for its retry
        self._timers = GroupTimers(self._waiting.get)
        self._order = itertools.count()
        self._changed: dict[str, list | None] = {}

    def on_message(self, msg: Msg, now: float) -> list[Emit]:
        return self._attempt(msg, 0, now)

    def on_time(self, now: float) -> list[Emit]:
        out: list[Emit] = []
        while (fired := self._timers.pop(now)) is not None:
            due, waiting = fired
            del self._waiting[waiting.key]
            self._changed[str(waiting.key)] = None
            out += self._attempt(waiting.msg, waiting.retries, due)
        return out

    # -- state per waiting retry (see base) ----------------------------------
    def changed_state(self) -> dict:
        changed, self._changed = self._changed, {}
        return changed

    def load_state(self, entries) -> None:
        for key, (due, msg, retries) in sorted(entries.items(), key=lambda kv: (kv[1][0], int(kv[0]))):
            waiting = self._waiting[int(key)] = _Retry(int(key), msg_from_json(msg), retries)
            self._timers.set(waiting, due)
        self._order = itertools.count(max((int(k) for k in entries), default=-1) + 1)

    def next_deadline(self) -> float | None:
        return self._timers.next()

    def pending(self) -> int:
        return len(self._waiting)

    def _attempt(self, msg: Msg, retries: int, now: float) -> list[Emit]:
        if self.handler is None:
            return [Emit("done", (msg,))]
        try:
            self.handler(msg)
        except self.transient as exc:
            if retries < self.max_retries:
                order = next(self._order)
                waiting = self._waiting[order] = _Retry(order, msg, retries + 1)
                self._timers.set(waiting, now + self.retry_interval)
                self._changed[str(order)] = [now + self.retry_interval, msg_json(msg), retries + 1]
                return []
            return [Emit("error", (msg,), {"reason": f"service error after {retries} retries: "
                                                     f"{type(exc).__name__}: {exc}"})]
        except Exception as exc:  # a service error: the handler failed for good
            return [Emit("error", (msg,), {"reason": f"service error: {type(exc).__name__}: {exc}"})]
        return [Emit("done", (msg,))]


def build(name: str, p: Params) -> ActionNode:
    p.only("handler", "transient", "retry_interval", "max_retries", "sink")
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
    )
