"""Running a flow over recorded input on a virtual clock (``twinflow replay``).

Input, one JSON object per line: ``{"at": <seconds, non-decreasing>, "id":
"<message id>", ...message fields}``; a line holding only ``"at"`` just moves
the clock. Output, one JSON object per emission, in the order messages leave
nodes: ``{"at", "node", "outlink", "id"}``, or ``"ids"`` when one emission
carries several messages, plus the emission's details (a reason, a sequence
number, incomplete recipients).

Time: before a message at time ``t`` enters, every deadline at or before
``t`` fires, in time order, each at its own deadline time (so an expiry at
12.5 is reported at 12.5). A deadline at exactly ``t`` fires before the
message that arrives at ``t``. After the last line the clock moves to
``until``, or, without it, on until no deadline is left.

Linked outlinks carry messages on to the next node at the same time. A group
emission (a join, an aggregation) travels on as one message whose ID is the
members' IDs joined by ``+`` and whose document is ``{"ids": [...],
"messages": [...]}``.

A bad line (not JSON, no ``at``, time going backwards, no message ID) is
reported with its line number on the error stream and the run goes on.

>>> from twinflow.runtime.flowgraph import parse_graph
>>> g = parse_graph("flow: f\\nnodes:\\n  a: {type: action}\\n")
>>> list(replay(g, ['{"at": 1, "id": "m1"}']))
[{'at': 1.0, 'node': 'a', 'outlink': 'done', 'id': 'm1'}]
"""

from __future__ import annotations

import json
from typing import Callable, Iterable, Iterator

from .fields import MissingField
from .flowgraph import FlowGraph
from .nodes.base import Emit, Msg

MAX_FIRINGS = 10_000_000  # a flow whose timers never run out is stopped here, not run forever


class BadEvent(ValueError):
    pass


class Engine:
    """One flow's nodes on a virtual clock; emissions go to ``record``."""

    def __init__(self, graph: FlowGraph, record: Callable[[dict], None]):
        self.graph = graph
        self.record = record
        self.now = float("-inf")

    def feed(self, msg: Msg, at: float) -> None:
        self.advance(at)
        self._deliver(self.graph.input, msg)

    def advance(self, to: float) -> None:
        """Fire every deadline at or before ``to``, in time order; the clock ends at ``to``."""
        self._fire(lambda t: t <= to)
        self.now = max(self.now, to)

    def drain(self) -> None:
        """Fire deadlines until none is left."""
        self._fire(lambda t: True)

    def _fire(self, due: Callable[[float], bool]) -> None:
        for _ in range(MAX_FIRINGS):
            name, deadline = self._earliest()
            if name is None or not due(deadline):
                return
            self.now = max(self.now, deadline)
            self._route(name, self.graph.nodes[name].on_time(self.now))
        raise RuntimeError(f"more than {MAX_FIRINGS} timer firings: a node's deadlines never run out")

    def _earliest(self) -> tuple[str | None, float]:
        best, best_t = None, float("inf")
        for name, node in self.graph.nodes.items():
            t = node.next_deadline()
            if t is not None and t < best_t:
                best, best_t = name, t
        return best, best_t

    def _deliver(self, name: str, msg: Msg) -> None:
        self._route(name, self.graph.nodes[name].on_message(msg, self.now))

    def _route(self, name: str, emits: list[Emit]) -> None:
        for e in emits:
            self.record(_line(self.now, name, e))
            nxt = self.graph.links.get(name, {}).get(e.outlink)
            if nxt is None:
                continue
            if len(e.msgs) == 1:
                self._deliver(nxt, e.msgs[0])
            else:
                ids = [m.id for m in e.msgs]
                self._deliver(nxt, Msg("+".join(ids), {"ids": ids, "messages": [dict(m.doc) for m in e.msgs]}))


def _line(at: float, node: str, e: Emit) -> dict:
    out: dict = {"at": at, "node": node, "outlink": e.outlink}
    if len(e.msgs) == 1:
        out["id"] = e.msgs[0].id
    else:
        out["ids"] = [m.id for m in e.msgs]
    for k, v in e.info.items():
        out.setdefault(k, v)
    return out


def parse_event(line: str, last_at: float, graph: FlowGraph) -> tuple[float, Msg | None]:
    """One input line as (time, message or None for a clock move); BadEvent says what is wrong."""
    try:
        event = json.loads(line)
    except json.JSONDecodeError as exc:
        raise BadEvent(f"not JSON: {exc}") from None
    if not isinstance(event, dict):
        raise BadEvent("not a JSON object")
    at = event.get("at")
    if isinstance(at, bool) or not isinstance(at, (int, float)):
        raise BadEvent("'at' is missing or not a number")
    if at < last_at:
        raise BadEvent(f"'at' goes back in time ({at} after {last_at})")
    doc = {k: v for k, v in event.items() if k != "at"}
    if not doc:
        return float(at), None
    try:
        msg_id = graph.id_path.get(doc)
    except MissingField as exc:
        raise BadEvent(str(exc)) from None
    if isinstance(msg_id, (dict, list)) or msg_id is None or msg_id == "":
        raise BadEvent(f"message ID {msg_id!r} is not a string or number")
    return float(at), Msg(str(msg_id), doc)


def replay(graph: FlowGraph, lines: Iterable[str], until: float | None = None,
           on_bad: Callable[[int, str], None] = lambda n, why: None) -> Iterator[dict]:
    """Run ``graph`` over event lines; yield output lines as they happen."""
    out: list[dict] = []
    engine = Engine(graph, out.append)
    last_at = float("-inf")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            at, msg = parse_event(line, last_at, graph)
        except BadEvent as exc:
            on_bad(number, str(exc))
            continue
        last_at = at
        if msg is None:
            engine.advance(at)
        else:
            engine.feed(msg, at)
        yield from out
        out.clear()
    if until is not None:
        engine.advance(until)
    else:
        engine.drain()
    yield from out
