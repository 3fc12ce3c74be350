"""A node's real collaborators: Redis, ZooKeeper, the gRPC server and Spark, as ``twinflow run``
uses them (the contract they fill is ``node_parts.NodeParts``).

Under failure: every connection waits for its server up to the node's
``connect_deadline_s`` and then raises ServiceUnavailable naming it. The JVM
is started before any gRPC thread exists.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from ..runtime.store.flow_store import FlowStore
from .connect import connect_zookeeper
from .escalation import EscalationSender, EscalationServicer
from .grpc_server import AdminServicer, IngestServicer, create_server
from .leadership import Leadership
from .master_session import write_pool
from .node_parts import UplinkStream, open_store

if TYPE_CHECKING:
    from .node import FlowNode


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
