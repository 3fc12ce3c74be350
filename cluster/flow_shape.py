"""What wrote a flow's state in Redis, checked before a peer joins: the state's format and the flow's nodes.

``tf:{F}:shape`` (a hash) holds ``format``, the state format of the twinflow that last started
a peer on the flow (:data:`STATE_FORMAT`), and ``nodes``, that peer's flow file's nodes and
their kinds (JSON). A peer starting on the flow (``check_shape``, before it reads anything):

- refuses a format newer than the one it reads: the state was written by a newer twinflow,
  whose entries this one may not understand (an upgrade goes forward host by host; a host
  rolled back must wait until the flow's state is its own again, which it never is);
- refuses a flow file that drops a node, or changes a node's kind, while Redis holds state
  entries of that node (open groups, held messages, retries, a history): starting would
  leave them to no node, never released or timed out. It names the node and how many entries
  it holds, and what to do (drain it first, or keep the node);
- accepts everything else (a changed time-out, retention or bake time, a node added, a node
  dropped that holds nothing), which takes effect as each peer restarts with the new file,
  and records its own format and nodes.

Under failure: a Redis error raises as the other start checks' do (the peer does not start);
nothing is written unless the flow file is accepted.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from ..runtime.flowgraph import FlowGraph
from .on_cluster import StartRefused

if TYPE_CHECKING:
    from ..runtime.store.flow_store import FlowStore

# The format of the state entries this code writes and reads. Raise it with any change to what a
# node's state entries hold that an older twinflow would misread, and say so in the changelog.
STATE_FORMAT = 1


def check_shape(graph: FlowGraph, store: "FlowStore") -> None:
    """Refuse (StartRefused) a start that would misread or orphan the flow's state; else record
    this peer's format and nodes (see the module doc)."""
    keys = store.keys
    recorded = store.call("read the flow's shape", lambda: store.r.hgetall(keys.shape))
    fmt = int(recorded.get(b"format", 0) or 0)
    if fmt > STATE_FORMAT:
        raise StartRefused(f"flow {graph.name!r}: its state in Redis was written by a newer twinflow (state format "
                           f"{fmt}); this peer reads up to format {STATE_FORMAT}. Upgrade twinflow on this host "
                           f"(docs/operations/deploy.md, rolling upgrade)")
    before = json.loads(recorded[b"nodes"]) if b"nodes" in recorded else {}
    now = {name: node.kind for name, node in graph.nodes.items()}
    for name in sorted(set(before) | _nodes_with_state(store)):
        if name in now and (name not in before or before[name] == now[name]):
            continue
        held = store.call("count a node's state", lambda name=name: store.r.hlen(keys.state(name)))
        if held:
            what = (f"drops node {name!r}" if name not in now
                    else f"changes node {name!r} from {before[name]} to {now[name]}")
            raise StartRefused(
                f"{graph.source}: this flow file {what}, but Redis holds {held} state entries of it (open groups, "
                f"held messages, retries or history): they would belong to no node. Keep the node until it holds "
                f"nothing (let its groups complete or time out), then change it (docs/operations/deploy.md, "
                f"changing a running flow)")
    store.call("record the flow's shape", lambda: store.r.hset(
        keys.shape, mapping={"format": STATE_FORMAT, "nodes": json.dumps(now, sort_keys=True)}))


def _nodes_with_state(store: "FlowStore") -> set[str]:
    """The nodes whose state hash exists in Redis (one slot: every key shares the flow's hash tag).
    Names starting with ``~`` are the flow's own records, not a node's."""
    prefix = store.keys.state("")
    found = store.call("list the nodes' state", lambda: list(store.r.scan_iter(match=prefix + "*", count=1000)))
    names = {(k.decode() if isinstance(k, bytes) else k)[len(prefix):] for k in found}
    return {n for n in names if n and not n.startswith("~")}
