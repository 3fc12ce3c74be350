"""One flow's nodes run in order: what replay and a cluster master both execute.

The engine hands each message to the flow's input node and carries every
emission on along the flow's links at the same time; an emission on an
unlinked outlink leaves the flow. Before a message at time ``t`` enters,
every deadline at or before ``t`` fires, in time order, each at its own
deadline time; ``advance`` fires deadlines without a message (the timers of
a cluster master). A group emission (a join, an aggregation) travels on as
one message whose ID is the members' IDs joined by ``+`` and whose document
is ``{"ids": [...], "messages": [...]}``.

A history node with external completion (``runtime/nodes/history.py``) is
told when each message it sent to ``new`` has finished: when the message
leaves the flow from a node reachable from that outlink, the engine calls
the history's ``finished``. (With nothing linked to ``new``, what runs the
message is outside the flow, and only a call of ``completed`` reports it.)

Nothing here reads a clock or touches a server: the caller passes time, and
``record`` (every emission, as a replay output line) and ``leave`` (each
emission that leaves the flow) say what happened. A node that raises stops
the call; the engine itself never drops a message.

>>> from twinflow.runtime.flowgraph import parse_graph
>>> g = parse_graph("flow: f\\nnodes:\\n  a: {type: action}\\n")
>>> left = []
>>> Engine(g, leave=lambda node, e, at: left.append((node, e.outlink, at))).feed(Msg("m1", {}), 2.0)
>>> left
[('a', 'done', 2.0)]

``passed`` counts what each link inside the flow took (an operator's console shows it):

>>> g = parse_graph("flow: f\\nnodes:\\n  h: {type: history, links: {new: a}}\\n  a: {type: action}\\n")
>>> e = Engine(g)
>>> for n in range(3):
...     e.feed(Msg(f"m{n % 2}", {}), 1.0 + n)
>>> e.passed
{('h', 'new'): 2}
"""

from __future__ import annotations

from typing import Callable

from .flowgraph import FlowGraph
from .nodes.base import Emit, Msg

MAX_FIRINGS = 10_000_000  # a flow whose timers never run out is stopped here, not run forever


class Engine:
    """One flow's nodes on a virtual clock; emissions go to ``record``."""

    def __init__(self, graph: FlowGraph, record: Callable[[dict], None] | None = None,
                 leave: Callable[[str, Emit, float], None] | None = None):
        self.graph = graph
        self.record = record
        self.leave = leave
        self.now = float("-inf")
        # When every node sets its deadlines after the time it takes a message at, a run of
        # messages at one time (a master's step) asks the nodes once: after ``advance(t)`` no
        # deadline is at or before t, and none comes, so ``_fired_to`` remembers t.
        self._quiet = all(node.sets_deadlines_after_now for node in graph.nodes.values())
        self._fired_to: float | None = None
        self._links = {(name, outlink): nxt for name, links in graph.links.items() for outlink, nxt in links.items()}
        # Messages each link took, (node, outlink) -> count, since this engine started: what an
        # operator's console shows on the links inside the flow (one dict update per emission
        # that stays in the flow; what leaves is counted by the caller's ``leave``).
        self.passed: dict[tuple[str, str], int] = {}
        self._finishers = _finishers(graph)

    def feed(self, msg: Msg, at: float) -> None:
        if at != self._fired_to:
            self.advance(at)
        self._deliver(self.graph.input, msg)

    def feed_at(self, node: str, msg: Msg, at: float, token: str | None = None) -> None:
        """As :meth:`feed`, but ``msg`` enters at ``node`` instead of the flow's input (a
        resubmitted message goes back to the node it failed at; ``token`` names the resubmit, for
        a node that guards it: an action's ``on_resubmit``); KeyError for a node the flow does
        not have."""
        if node not in self.graph.nodes:
            raise KeyError(f"the flow has no node {node!r}")
        if at != self._fired_to:
            self.advance(at)
        target = self.graph.nodes[node]
        if token is not None and hasattr(target, "on_resubmit"):
            self._route(node, target.on_resubmit(msg, self.now, token))
        else:
            self._deliver(node, msg)

    def advance(self, to: float) -> None:
        """Fire every deadline at or before ``to``, in time order; the clock ends at ``to``."""
        self._fire(lambda t: t <= to)
        self.now = max(self.now, to)
        self._fired_to = to if self._quiet else None

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

    def next_deadline(self) -> float | None:
        """The earliest deadline of any node, or None."""
        name, at = self._earliest()
        return None if name is None else at

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
        links = self._links
        for e in emits:
            if self.record is not None:
                self.record(output_line(self.now, name, e))
            nxt = links.get((name, e.outlink))
            if nxt is None:
                if self.leave is not None:
                    self.leave(name, e, self.now)
                if self._finishers:  # most flows have none: no lookup per emission
                    for history in self._finishers.get((name, e.outlink), ()):
                        for m in e.msgs:
                            history.finished(m, self.now)
                continue
            key = (name, e.outlink)
            self.passed[key] = self.passed.get(key, 0) + len(e.msgs)
            if len(e.msgs) == 1:
                self._deliver(nxt, e.msgs[0])
            else:
                ids = [m.id for m in e.msgs]
                self._deliver(nxt, Msg("+".join(ids), {"ids": ids, "messages": [dict(m.doc) for m in e.msgs]}))


def _finishers(graph: FlowGraph) -> dict[tuple[str, str], tuple]:
    """(node, outlink) -> the external-completion histories to tell when a message leaves the
    flow there: every unlinked outlink of a node reachable from a history's ``new``."""
    found: dict[tuple[str, str], list] = {}
    for name, node in graph.nodes.items():
        if not getattr(node, "external", False) or not hasattr(node, "finished"):
            continue
        links = graph.links.get(name, {})
        if "new" not in links:
            continue
        node.tracked = True  # the engine reports when each message sent to `new` finished
        reached, todo = set(), [links["new"]]
        while todo:
            nxt = todo.pop()
            if nxt in reached:
                continue
            reached.add(nxt)
            out = graph.links.get(nxt, {})
            todo.extend(out.values())
            if hasattr(graph.nodes[nxt], "decide_doubt"):  # an action it guards asks it about doubted attempts
                graph.nodes[nxt].decide_doubt = node.decide
            for outlink in graph.nodes[nxt].outlinks:
                if outlink not in out:
                    found.setdefault((nxt, outlink), []).append(node)
    return {k: tuple(v) for k, v in found.items()}


def output_line(at: float, node: str, e: Emit) -> dict:
    out: dict = {"at": at, "node": node, "outlink": e.outlink}
    if len(e.msgs) == 1:
        out["id"] = e.msgs[0].id
    else:
        out["ids"] = [m.id for m in e.msgs]
    for k, v in e.info.items():
        out.setdefault(k, v)
    return out


