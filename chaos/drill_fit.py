"""Which local drills apply to a flow, and why the others do not (``twinflow drill all --flow F``).

A drill that does not apply to a flow is not run: it would fail for what the flow lacks
(``kill-in-handler`` waits for a handler call the flow never makes) or pass without testing what
it says (``escalation-cut`` on a flow without a claim pair has no escalation to cut).
:func:`not_applicable` gives the reason, or None for a drill that applies:

- every local drill follows one master and one epoch per flow: none applies to a sharded flow
  (each shard has its own; its drill between hosts is ``twinflow drill spark-worker-crash --hosts``);
- the guarded-handler drills (``kill-in-handler``, ``resubmit-in-failover``) need an action whose
  handler a history node with ``completion: external`` guards (the action is reached from the
  history's ``new``), and that handler must be ``book`` of ``examples/ledger_handlers.py``: the
  drills see a call under way, refuse orders and count the bookings only in that ledger;
- the escalation drills (``escalation-cut``, ``escalation-latency``) need a claim pair (a sort
  with ``pairs_with``): without one the master sends no escalation.

:func:`books_in_ledger` tells whether a flow's handler books into that ledger, so that any drill of
such a flow prepares the ledger (the handler writes into it) and runs at the guarded flow's rate.

Under failure: nothing here starts or connects to anything; it reads the parsed flow only, so a
flow file that cannot be parsed was refused before, with its file, line and field.
"""

from __future__ import annotations

from ..runtime.flowgraph import FlowGraph
from ..runtime.nodes.action import ActionNode
from ..runtime.nodes.history import NEW, HistoryNode

# The drills of a guarded handler (drill_faults.GUARDED) and those that need escalations to fault.
GUARDED = frozenset({"kill-in-handler", "resubmit-in-failover"})
NEEDS_PAIR = frozenset({"escalation-cut", "escalation-latency"})
# The handler the guarded drills watch (examples/ledger_handlers.py, as the flow file names it).
LEDGER_HANDLER = ("ledger_handlers", "book")


def not_applicable(name: str, graph: FlowGraph) -> str | None:
    """Why drill ``name`` does not apply to ``graph``, or None when it does."""
    spec = graph.cluster
    if spec is not None and spec.shards > 1:
        return (f"the flow is sharded (uplink.shards: {spec.shards}): the local drills follow one master and "
                f"epoch, a sharded flow has one per shard (its drill between hosts: "
                f"twinflow drill spark-worker-crash --hosts)")
    if name in GUARDED:
        guarded = guarded_actions(graph)
        if not guarded:
            return ("no action's handler is guarded by a history node with completion: external (the drill "
                    "kills the master inside such a handler call)")
        if not any(_is_ledger(graph.nodes[n]) for n in guarded):
            names = ", ".join(f"{n} ({_handler_name(graph.nodes[n])})" for n in guarded)
            return (f"the guarded handler of {names} is not examples/ledger_handlers.py's book: the drill sees a "
                    f"call under way, and counts the bookings, only in that ledger")
    if name in NEEDS_PAIR and (spec is None or spec.pair is None):
        return "the flow has no claim pair (a sort node with pairs_with): its master sends no escalations"
    return None


def guarded_actions(graph: FlowGraph) -> list[str]:
    """The action nodes with a handler that a history node with external completion guards: those
    its ``new`` outlink leads to, directly or through other nodes, in the flow's order."""
    guarded: set[str] = set()
    for name, node in graph.nodes.items():
        if isinstance(node, HistoryNode) and node.external:
            first = graph.links.get(name, {}).get(NEW)
            guarded |= _downstream(graph, first) if first else set()
    return [n for n, node in graph.nodes.items()
            if n in guarded and isinstance(node, ActionNode) and node.handler is not None]


def books_in_ledger(graph: FlowGraph) -> bool:
    """Whether an action of ``graph`` calls examples/ledger_handlers.py's ``book``."""
    return any(isinstance(node, ActionNode) and _is_ledger(node) for node in graph.nodes.values())


def _downstream(graph: FlowGraph, start: str) -> set[str]:
    """``start`` and every node its links lead to (the flow has no cycles)."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph.links.get(name, {}).values())
    return seen


def _is_ledger(node) -> bool:
    return isinstance(node, ActionNode) and _handler_name(node) == ".".join(LEDGER_HANDLER)


def _handler_name(node: ActionNode) -> str:
    handler = node.handler
    return f"{getattr(handler, '__module__', '?')}.{getattr(handler, '__qualname__', repr(handler))}"
