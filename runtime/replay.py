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

from .engine import Engine
from .fields import MissingField
from .flowgraph import FlowGraph
from .nodes.base import Msg


class BadEvent(ValueError):
    pass


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
