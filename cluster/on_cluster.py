"""What a flow file needs to run on the cluster, and the Redis keys it runs on.

Under failure: a flow that cannot run on the cluster is refused before
anything starts (:class:`StartRefused`, with the reason).
"""

from __future__ import annotations

import logging

from ..runtime.flowgraph import FlowGraph
from ..runtime.store.flow_keys import FlowKeys
from .master_flow import not_on_cluster

log = logging.getLogger("twinflow.peer")


class StartRefused(RuntimeError):
    """The peer will not start: reading from here, or on this Redis, could break a promise."""


def cluster_refusals(graph: FlowGraph) -> list[tuple[str, str]]:
    """Each thing that keeps the flow from running on the cluster, as (field, reason):
    ``twinflow validate`` reports them all, :func:`cluster_flow` refuses the first."""
    if graph.cluster is None:
        return [("uplink", f"flow {graph.name!r} has no uplink section, so it runs in replay only "
                           f"(docs/reference/flow-file.md)")]
    found = []
    local = not_on_cluster(graph)
    if local:
        found.append(("nodes", f"these nodes keep their state in one process only so far and run in replay "
                               f"only: {', '.join(local)}"))
    for name, node in graph.nodes.items():
        if getattr(node, "external", False) and "new" not in graph.links.get(name, {}):
            found.append((f"nodes.{name}", "completion: external needs a node linked to its 'new' outlink (the "
                                           "handler it guards): on the cluster nothing else reports that a "
                                           "message finished, so every one would come back In Doubt"))
    return found


def cluster_flow(graph: FlowGraph):
    """The flow's cluster sections; StartRefused when the flow cannot run on the cluster."""
    for field, reason in cluster_refusals(graph):
        raise StartRefused(f"{graph.source}: {field}: {reason}")
    return graph.cluster


def flow_keys(graph: FlowGraph) -> FlowKeys:
    """The flow's Redis keys: its uplink, and as its sink the paired action's (or the only action's)."""
    spec = graph.cluster
    actions = [n for n in graph.nodes.values() if getattr(n, "sink", None)]
    pair_action = graph.nodes.get(spec.pair.action) if spec and spec.pair else None
    sink = getattr(pair_action, "sink", None) or (actions[0].sink if len(actions) == 1 else None)
    return FlowKeys(graph.name, spec.uplink_stream if spec else "uplink", sink or "sink")
