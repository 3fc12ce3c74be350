"""A flow's stores as an operator's tool opens them: one per uplink shard (one for an unsharded
flow), each on its own connection to the flow's Redis, as ``twinflow status``, ``failures``
and the console read it.

Under failure: opening makes no round trip that can fail: Redis down is reported by the
first call a store makes (a Redis Cluster whose slots cannot be read yet is dialled
without them, the first call finding out).
"""

from __future__ import annotations

import redis

from ..runtime.flowgraph import FlowGraph
from ..runtime.shards import shard_graph
from ..runtime.store.flow_store import FlowStore
from ..runtime.store.redis_slot import client_from_url
from .on_cluster import flow_keys


def operator_stores(graph: FlowGraph, url: str, who: str = "cli", *, deadline_s: float | None = None
                    ) -> list[FlowStore]:
    """One store per shard of ``graph`` on the Redis at ``url``, writing (when it writes) as ``who``.
    With ``deadline_s`` (a server that must answer promptly: the console) every call gives up
    after about that long, and so does every socket read: a Redis that accepts and never answers
    is as down as one that refuses."""
    timeouts = {"socket_connect_timeout": min(3, deadline_s or 3)}
    if deadline_s is not None:
        timeouts["socket_timeout"] = deadline_s
    stores = []
    for k in range(graph.cluster.shards if graph.cluster else 1):
        keys = flow_keys(shard_graph(graph, k))
        try:
            client = client_from_url(url, slot_key=keys.uplink, **timeouts)
        except redis.RedisError:  # down: the command's first call reports it
            client = client_from_url(url, **timeouts)  # no round trip: cannot fail
        store = FlowStore(client, keys, who) if deadline_s is None else FlowStore(client, keys, who,
                                                                                   call_deadline_s=deadline_s)
        stores.append(store)
    return stores
