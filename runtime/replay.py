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

A bad line (not JSON, no ``at``, an ``at`` that is not a finite number, time
going backwards, no message ID, an ID that is not a non-empty string or
integer) is reported with its line number on the error stream and the run
goes on. IDs follow the cluster's rule (``runtime/message.py``): ``1`` and
``"1"`` are the same ID. So does the claim pair of a cluster flow: a message
whose ruleset's key or claim ID cannot be built (the cluster sends it to its
failure stream on both peers) is a bad line here too, with the same reason.

>>> from twinflow.runtime.flowgraph import parse_graph
>>> g = parse_graph("flow: f\\nnodes:\\n  a: {type: action}\\n")
>>> list(replay(g, ['{"at": 1, "id": "m1"}']))
[{'at': 1.0, 'node': 'a', 'outlink': 'done', 'id': 'm1'}]
"""

from __future__ import annotations

import json
import math
from typing import Callable, Iterable, Iterator

from .engine import Engine
from .fields import BadInput, MissingField
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
    # json reads NaN and Infinity, and integers too large for a float: each would crash
    # the clock later (OverflowError), far from the line that caused it.
    try:
        at = float(at)
    except OverflowError:
        raise BadEvent("'at' is too large for a time") from None
    if not math.isfinite(at):
        raise BadEvent(f"'at' is not a finite number ({at})")
    if at < last_at:
        raise BadEvent(f"'at' goes back in time ({at} after {last_at})")
    doc = {k: v for k, v in event.items() if k != "at"}
    if not doc:
        return at, None
    try:
        msg_id = graph.id_path.get(doc)
    except MissingField as exc:
        raise BadEvent(str(exc)) from None
    # The cluster's rule (message.decode): a boolean or a float read as its text would be
    # an ID the cluster refuses, so replay would show a flow the cluster never runs.
    if msg_id == "":
        raise BadEvent(f"ID field '{graph.id_path.path}' is empty")
    if not isinstance(msg_id, (str, int)) or isinstance(msg_id, bool):
        raise BadEvent(f"ID field '{graph.id_path.path}' is not a non-empty string or integer")
    rules = graph.message.claim_rules  # a cluster flow's claim pair: the cluster's decode refuses these
    if rules is not None:
        try:
            rules.classify(doc)
        except BadInput as exc:
            raise BadEvent(str(exc)) from None
    return at, Msg(str(msg_id), doc)


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
