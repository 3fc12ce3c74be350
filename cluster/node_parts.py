"""What a flow node is built from: its collaborators, passed in rather than built inside.

:class:`~twinflow.cluster.node.FlowNode` takes a :class:`NodeParts` and asks
it, in this order, for its Redis store, its ZooKeeper client, its gRPC
server, its escalation sender, its leadership, its timers and, last, its
uplink stream; and where its master's COMMITs are sent from (``writes``) and
where its master's batches run ahead of Spark (``batches_ahead``, or None).
:class:`~twinflow.cluster.real_parts.RealParts` connects to the servers
named in the node's config and runs Spark; a test or a failover simulator passes its own
parts (an in-memory stream that calls ``node.on_batch``, a store on a
private Redis, a leadership it drives by hand) and drives the same node
logic without Spark or ZooKeeper.

Under failure: :func:`open_store` waits for Redis up to the node's
``connect_deadline_s`` and then raises ServiceUnavailable naming it.
"""

from __future__ import annotations

from concurrent.futures import Executor
from typing import TYPE_CHECKING, Any, Protocol

from ..runtime.cluster_spec import ClusterSpec
from ..runtime.store.flow_keys import FlowKeys
from ..runtime.store.flow_store import FlowStore
from .connect import connect_redis
from .escalation import EscalationSender
from .leadership import Leadership

if TYPE_CHECKING:
    from .node import FlowNode


class UplinkStream(Protocol):
    """The running reader of the uplink that calls ``node.on_batch`` (Spark's query, or a fake)."""

    @property
    def isActive(self) -> bool: ...  # noqa: N802  (Spark's name)

    def exception(self) -> Any: ...


class NodeParts(Protocol):
    def store(self, node: "FlowNode") -> FlowStore: ...
    def zookeeper(self, node: "FlowNode") -> Any: ...
    def server(self, node: "FlowNode") -> tuple[Any, int]: ...
    def sender(self, node: "FlowNode") -> EscalationSender: ...
    def leadership(self, node: "FlowNode") -> Leadership: ...
    def start_timers(self, node: "FlowNode") -> None: ...
    def prepare_stream(self, node: "FlowNode") -> None: ...
    def stream(self, node: "FlowNode", start: dict) -> UplinkStream: ...
    def hold(self, stream: UplinkStream, held: bool) -> None: ...
    def pace(self, stream: UplinkStream, interval_ms: int) -> None: ...
    def stop_stream(self, stream: UplinkStream) -> None: ...
    def writes(self) -> Executor: ...
    def batches_ahead(self) -> Executor | None: ...
    def close(self) -> None: ...


def open_store(redis_url: str, connect_deadline_s: float, keys: FlowKeys, node_id: str,
               spec: ClusterSpec) -> FlowStore:
    """A flow's (or a shard's) store for ``node_id``, on the Redis that owns its slot."""
    # Each Redis call is bounded by the lease, so a link that drops packets
    # shows as failed writes in time for the master to step down.
    client = connect_redis(redis_url, connect_deadline_s, socket_timeout_s=max(0.5, spec.write_lease),
                           slot_key=keys.uplink)
    return FlowStore(client, keys, node_id, id_ttl=spec.message.id_ttl)
