"""What a flow node is built from: its collaborators, passed in rather than built inside.

:class:`~twinflow.cluster.node.FlowNode` takes a :class:`NodeParts` and asks
it, in this order, for its Redis store, its ZooKeeper client, its gRPC
server, its escalation sender, its leadership, its timers and, last, its
uplink stream; and where its master's COMMITs are sent from (``writes``) and
where its master's batches run ahead of Spark (``batches_ahead``, or None).
:class:`RealParts` (the default) connects to the servers named in the
node's config and runs Spark; a test or a failover simulator passes its own
parts (an in-memory stream that calls ``node.on_batch``, a store on a
private Redis, a leadership it drives by hand) and drives the same node
logic without Spark or ZooKeeper.

Under failure: every ``RealParts`` connection waits for its server up to the
node's ``connect_deadline_s`` and then raises ServiceUnavailable naming it.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Protocol

from ..runtime.cluster_spec import ClusterSpec
from ..runtime.store.flow_store import FlowKeys, FlowStore
from .connect import connect_redis, connect_zookeeper
from .escalation import EscalationSender, EscalationServicer
from .grpc_server import AdminServicer, IngestServicer, create_server
from .leadership import Leadership
from .master_steps import write_pool

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


class RealParts:
    """Real servers and Spark, as ``twinflow run`` uses them."""

    def __init__(self) -> None:
        self.spark = None

    def store(self, node: "FlowNode") -> FlowStore:
        return open_store(node.cfg.redis_url, node.cfg.connect_deadline_s, node.keys, node.cfg.node_id, node.spec)

    def zookeeper(self, node: "FlowNode") -> Any:
        return connect_zookeeper(node.cfg.zk_hosts, node.cfg.connect_deadline_s, node.spec.session_timeout)

    def start_timers(self, node: "FlowNode") -> None:
        threading.Thread(target=node.run_timers, name="timers", daemon=True).start()

    def prepare_stream(self, node: "FlowNode") -> None:
        # The JVM is forked before any gRPC object exists: forking while gRPC's
        # threads run broke the JVM launch (seen once in ~13 starts).
        from ..runtime.spark.session import build_session

        self.spark = build_session(f"twinflow-{node.name}-{node.cfg.node_id}", node.cfg.spark_master,
                                   node.cfg.spark_conf)

    def server(self, node: "FlowNode") -> tuple[Any, int]:
        return create_server(
            node.cfg.listen,
            escalation=EscalationServicer(node.name, node.on_claims, node.admit_escalation),
            # With cluster.wait_replicas a publish is acknowledged once that many replicas have it.
            ingest=IngestServicer(node.name, lambda bodies, deadline_s: node.store.publish(
                bodies, deadline_s, replicas=node.spec.wait_replicas, replica_wait_ms=node.spec.replica_wait_ms)),
            admin=AdminServicer(node.status, node.handover),
            security=node.cfg.security,
            health=node.health.servicer,
        )

    def sender(self, node: "FlowNode") -> EscalationSender:
        return EscalationSender(node.name, node.cfg.node_id, lambda: node.epoch, node.escalation_targets,
                                batch_max=node.spec.escalation_batch, security=node.cfg.security)

    def leadership(self, node: "FlowNode") -> Leadership:
        return Leadership(node.zk, node.name, node.cfg.node_id, node.address, node.on_promoted,
                          node.on_demoted, may_contend=node.may_contend)

    def stream(self, node: "FlowNode", start: dict) -> UplinkStream:
        from ..runtime.spark.stream import start_stream

        checkpoint = node.checkpoint_dir()
        checkpoint.parent.mkdir(parents=True, exist_ok=True)
        return start_stream(
            self.spark,
            redis_url=node.cfg.redis_url,
            stream=node.keys.uplink,
            checkpoint_dir=str(checkpoint),
            on_batch=node.on_batch,
            batch_size=node.read_size,
            max_batch_size=node.max_read_size,
            batch_bytes=node.spec.batch_bytes,
            max_body_bytes=node.spec.message.max_bytes,
            status_key=node.keys.read(node.cfg.node_id),
            query_name=f"{node.name}_{node.cfg.node_id}".replace("-", "_"),
            source_options={"warmup": "1", "start_id": start["id"], "start_n": str(start["n"])},
        )

    def hold(self, stream: UplinkStream, held: bool) -> None:
        from ..runtime.spark.stream import hold_stream

        hold_stream(stream, held)

    def pace(self, stream: UplinkStream, interval_ms: int) -> None:
        from ..runtime.spark.stream import pace_stream

        pace_stream(stream, interval_ms)

    def stop_stream(self, stream: UplinkStream) -> None:
        from ..runtime.spark.stream import stop_stream

        stop_stream(stream, 10.0)

    def writes(self) -> Executor:
        return write_pool()

    def batches_ahead(self) -> Executor | None:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinflow-batch")

    def close(self) -> None:
        if self.spark is not None:
            self.spark.stop()
