"""A node of a flow with several uplink shards: one pair per shard, one Spark query for all.

Each shard (``runtime/shards.py``) is a flow of its own on the cluster, so
this process holds one :class:`~twinflow.cluster.node.FlowNode` per shard,
each with its own Redis keys, ZooKeeper election, epoch and fence,
escalation stream, bake, timers and status. Promotion, the catch-up that
rolls a shard's unclaimed messages back, fencing and stepping down are the
shard node's own, exactly as for an unsharded flow (``node.py``'s promises
hold per shard). A node may be master of one shard and worker of another;
two nodes each end up master of some shards.

What the shards share here: one ZooKeeper session, one gRPC server (its
escalation service routes each batch to its shard by flow name; its ingest
routes each published body to its shard by ``uplink.shard_key``), and one
Spark query whose source (``shard_source``) reads each shard with new
entries as one partition. Each micro-batch is planned here (the role and
epoch of every shard, with every shard's batch lock held so no promotion or
timer step interleaves) and run where each partition is read, on the
executors (``shard_task``); the results come back here to be escalated and
baked (``FlowNode.take_result``). On ``--spark-master spark://...`` the
executors are the cluster's; a node can then use more cores than its own
machine has.

Under failure: a task that fails is retried by Spark, then fails the query
and the node exits (its batch uncommitted, read again on restart, each
committed step recognised as processed). A held shard (backpressure) stops
only that shard's reading.
"""

from __future__ import annotations

import logging
import os
import threading
from contextlib import ExitStack
import pickle
import time
from dataclasses import replace
from functools import partial
from typing import Any

from ..logs import event
from ..runtime.flowgraph import FlowGraph
from ..runtime.shards import ShardRouter, shard_graph
from .connect import connect_zookeeper
from .escalation import EscalationServicer
from .grpc_server import AdminServicer, IngestServicer, create_server
from .metrics import BatchTimings
from .roles import MASTER
from .node import FlowNode
from .host import NodeConfig, run_until_stopped, start_metrics
from .batch_intake import NodeStopping
from .on_cluster import cluster_flow
from .health import NodeHealth
from .real_parts import RealParts
from .shard_task import RESULT_SCHEMA, ShardPlan, run_partition

log = logging.getLogger("twinflow.sharded")


class _Borrowed:
    """A shared server or client lent to a shard node: its stop and close are the owner's."""

    def __init__(self, target: Any):
        self._target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self._target, name)

    def stop(self, *args, **kwargs) -> None:
        return None

    def close(self) -> None:
        return None


class _QueryView:
    """The shared query as a shard node sees it (it exists only once every shard started)."""

    def __init__(self, owner: "ShardedNode"):
        self._owner = owner

    @property
    def isActive(self) -> bool:  # noqa: N802  (Spark's name)
        q = self._owner.query
        return q is None or q.isActive

    def exception(self) -> Any:
        q = self._owner.query
        return q.exception() if q is not None else None


class _ShardParts(RealParts):
    """A shard node's parts: its own store, sender, leadership and timers; the rest shared."""

    def __init__(self, owner: "ShardedNode", shard: int):
        super().__init__()
        self.owner, self.shard = owner, shard

    def zookeeper(self, node: FlowNode) -> Any:
        return _Borrowed(self.owner.zk)

    def prepare_stream(self, node: FlowNode) -> None:
        return None  # the owner built the session

    def server(self, node: FlowNode) -> tuple[Any, int]:
        return _Borrowed(self.owner.server), self.owner.port

    def stream(self, node: FlowNode, start: dict) -> Any:
        self.owner.starts[self.shard] = start
        return _QueryView(self.owner)

    def hold(self, stream: Any, held: bool) -> None:
        self.owner.hold(self.shard, held)

    def pace(self, stream: Any, interval_ms: int) -> None:
        return None  # one query for every shard: it reads each as soon as there is something

    def stop_stream(self, stream: Any) -> None:
        return None

    def batches_ahead(self) -> None:
        return None  # the shared query's batches come through ShardedNode, never on_batch

    def close(self) -> None:
        return None


class ShardedNode:
    """One node process of a sharded flow (see the module doc)."""

    def __init__(self, graph: FlowGraph, config: NodeConfig):
        spec = cluster_flow(graph)
        self.graph, self.spec, self.cfg = graph, spec, config
        self.name = graph.name
        self.router = ShardRouter(spec.shards, spec.shard_key)
        # The shards' metrics are served by this node's one endpoint (start), not each their own.
        shard_config = replace(config, metrics_listen=None)
        self.shards = [FlowNode(shard_graph(graph, k), shard_config, parts=_ShardParts(self, k))
                       for k in range(spec.shards)]
        # One health service for the one server: it serves once the first shard streams.
        self.health = NodeHealth()
        for shard in self.shards:
            shard.health = self.health
        self.starts: dict[int, dict] = {}
        self.spark = None
        self.zk = None
        self.server = None
        self.port = 0
        self.query = None
        self._held: set[int] = set()
        self._hold_lock = threading.Lock()
        self._stop = threading.Event()
        self._term_requested = threading.Event()
        self._stopped = False
        self.batches = 0
        self.frame_timings = BatchTimings(("shards",))  # each micro-batch, all shards, for the metrics
        self.metrics = None
        self.batch_error = None  # run_until_stopped's check: shards' batches never run ahead here

    # -- life cycle -------------------------------------------------------
    def start(self) -> None:
        from ..runtime.spark.session import build_session

        cfg = self.cfg
        if cfg.metrics_listen:  # first: a bad metrics address stops nothing half started
            self.metrics = start_metrics(cfg, lambda: self.shards, lambda: self.server, self.name,
                                         frames=(self.name, self.frame_timings))
        # The JVM first, before any gRPC thread exists (see RealParts.prepare_stream).
        self.spark = build_session(f"twinflow-{self.name}-{cfg.node_id}", cfg.spark_master, cfg.spark_conf)
        self.zk = connect_zookeeper(cfg.zk_hosts, cfg.connect_deadline_s, self.spec.session_timeout)
        self.server, self.port = create_server(
            cfg.listen,
            escalation=EscalationServicer.for_flows({s.name: (s.on_claims, s.admit_escalation)
                                                     for s in self.shards}),
            ingest=IngestServicer(self.name, self.publish),
            admin=AdminServicer(self.status, self.handover),
            security=cfg.security,
            health=self.health.servicer,
        )
        cfg.security.warn_if_insecure(cfg.listen, self._stop)
        for shard in self.shards:
            shard.start()
        self._start_query()
        event(log, logging.INFO, "started", "%s reads %d shards of %s on %s", cfg.node_id, len(self.shards),
              self.name, cfg.spark_master, flow=self.name, node=cfg.node_id, shards=len(self.shards))

    def _start_query(self) -> None:
        from ..runtime.spark.stream import start_shard_stream

        checkpoint = os.path.join(self.cfg.state_dir, self.name, self.cfg.node_id, "checkpoint")
        os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
        self.query = start_shard_stream(
            self.spark,
            redis_url=self.cfg.redis_url,
            shards=[{"stream": s.keys.uplink, "status_key": s.keys.read(self.cfg.node_id),
                     "start_id": self.starts[k]["id"], "start_n": self.starts[k]["n"]}
                    for k, s in enumerate(self.shards)],
            checkpoint_dir=checkpoint,
            on_frame=self.on_frame,
            max_batch_size=min(s.max_read_size for s in self.shards),
            batch_bytes=self.spec.batch_bytes,
            max_body_bytes=self.spec.message.max_bytes,
            query_name=f"{self.name}_{self.cfg.node_id}".replace("-", "_").replace(".", "_"),
        )

    def run_forever(self) -> int:
        """Run until stopped; SIGTERM hands every shard this node is master of over first."""
        return run_until_stopped(self, lambda: any(s.role == MASTER for s in self.shards))

    def request_term(self) -> None:
        self._term_requested.set()

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        # Each shard logs its own "stopping" with its role and epoch; this one is the process's.
        event(log, logging.INFO, "stopping", "%s stopping %d shards of %s", self.cfg.node_id, len(self.shards),
              self.name, flow=self.name, node=self.cfg.node_id, shards=len(self.shards))
        self._stop.set()
        self.health.stopping()
        for shard in self.shards:
            shard.stop()  # closes its store, so a batch waiting for Redis here gives up
        if self.query is not None:
            from ..runtime.spark.stream import stop_stream

            try:
                stop_stream(self.query, 10.0)
            except Exception:  # a batch refused on purpose (NodeStopping) fails the query
                log.info("shard stream stopped with its last batch uncommitted (read again on restart)")
        if self.server is not None:
            self.server.stop(1.0)
        if self.metrics is not None:
            self.metrics.stop()
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        if self.spark is not None:
            self.spark.stop()

    # -- batches ----------------------------------------------------------
    def on_frame(self, frame, batch_id: int) -> None:
        """Plan a micro-batch, run it on the executors, finish each shard's part here."""
        started = time.perf_counter()
        with ExitStack() as held:
            for shard in self.shards:  # always in shard order: no two batches or promotions cross
                held.enter_context(shard._work)
            if self._stop.is_set():
                raise NodeStopping(f"batch {batch_id} arrived while stopping; it is read again on restart")
            plan = ShardPlan(
                flow_text=self.graph.text, flow_source=self.graph.source, redis_url=self.cfg.redis_url,
                node_id=self.cfg.node_id, now=self.shards[0].clock.now(),
                connect_deadline_s=self.cfg.connect_deadline_s,
                roles={k: s.executor_role() for k, s in enumerate(self.shards)},
                generations={k: s.driver_steps for k, s in enumerate(self.shards)},
            )
            table = frame.mapInArrow(partial(run_partition, plan), RESULT_SCHEMA).toArrow()

            for blob in table.column(0).to_pylist():
                result = pickle.loads(blob)
                if result.shard < 0:
                    for shard in self.shards:
                        shard._warmed()
                    continue
                self.shards[result.shard].take_result(batch_id, result)
            self.batches += 1
        self.frame_timings.observe("shards", time.perf_counter() - started)

    def hold(self, shard: int, held: bool) -> None:
        from ..runtime.spark.stream import hold_shards

        with self._hold_lock:
            (self._held.add if held else self._held.discard)(shard)
            if self.query is not None:
                hold_shards(self.query, set(self._held))

    # -- gRPC -------------------------------------------------------------
    def publish(self, bodies: list[bytes], deadline_s: float | None = None) -> list[str]:
        """Append each body to its shard's uplink; positions as ``<shard flow>/<entry ID>``."""
        positions: list[str] = [""] * len(bodies)
        for k, items in self.router.split(bodies).items():
            shard = self.shards[k]
            ids = shard.store.publish([b for _, b in items], deadline_s=deadline_s)
            for (i, _), entry in zip(items, ids):
                positions[i] = f"{shard.name}/{entry}"
        return positions

    def status(self) -> dict:
        """The node's status: counts summed over its shards, ``role`` per shard."""
        rows = [s.status() for s in self.shards]
        out = dict(rows[0])
        out["flow"] = self.name
        for key in ("pending", "baked", "claimed", "rolled_back", "delivered", "failed", "unclaimed",
                    "uplink_lag", "backpressure", "holding"):
            out[key] = sum(int(r.get(key) or 0) for r in rows)
        out["streaming"] = int(all(r["streaming"] for r in rows))
        out["role"] = " ".join(f"s{k}:{r['role']}" for k, r in enumerate(rows))
        out["epoch"] = max(r["epoch"] for r in rows)
        return out

    def handover(self, timeout_s: float) -> dict:
        """Hand every shard this node is master of over; ok when each one was."""
        masters = [s for s in self.shards if s.role == MASTER]
        if not masters:
            return {"ok": False, "reason": "this node is master of no shard"}
        replies = [(s.name, s.handover(timeout_s)) for s in masters]
        failed = [f"{name}: {r.get('reason')}" for name, r in replies if not r.get("ok")]
        return {"ok": not failed, "reason": "; ".join(failed),
                "new_master": ",".join(sorted({r.get("new_master", "") for _, r in replies} - {""})),
                "seconds": max(float(r.get("seconds") or 0) for _, r in replies)}

    @property
    def address(self) -> str:
        return self.shards[0].address
