"""The process host: what one ``twinflow run`` process holds whatever flows it runs.

Its config (:class:`NodeConfig`), its metrics endpoint, and the loop that
runs it until it stops. Under failure: a SIGTERM hands the master role over
first (and stops all the same when ZooKeeper cannot be reached); an uplink
stream that died, or a batch that ran ahead and failed, stops the process
with exit code 1 so that a supervisor restarts it and Spark reads the
uncommitted batch again.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..grpc_security import NO_SECURITY, GrpcSecurity
from ..logs import event
from .metrics import MetricsServer
from .metrics import serve as serve_metrics
from .on_cluster import StartRefused

log = logging.getLogger("twinflow.node")


@dataclass
class NodeConfig:
    node_id: str
    redis_url: str
    zk_hosts: str
    listen: str = "127.0.0.1:0"
    advertise: str | None = None      # the address other nodes dial; default: the bound one
    spark_master: str = "local[1]"
    spark_conf: dict | None = None    # further Spark settings (--spark-conf)
    state_dir: str = ".twinflow"
    connect_deadline_s: float = 60.0
    status_interval_s: float = 0.5
    sweep_interval_s: float = 1.0
    trim_interval_s: float = 10.0     # how often the master trims the uplink (uplink.retention)
    worker_pace_ms: int = 250         # a worker plans a batch at most this often (the master: at once)
    start_from: str | None = None     # a new state dir on a processed flow: "processed" or "beginning"
    security: GrpcSecurity = NO_SECURITY  # gRPC TLS and tokens, served and used to escalate
    metrics_listen: str | None = None  # HOST:PORT of the node's Prometheus metrics (HTTP), or none


def run_until_stopped(node, is_master) -> int:
    """Start ``node`` (a FlowNode or a ShardedNode) and run it until stopped: 0 after a stop or
    a SIGTERM, which hands over first while ``is_master()``; 1 when its uplink stream died."""
    node.start()
    while not node._stop.is_set():
        if node._term_requested.is_set():
            if is_master():
                try:
                    result = node.handover(5.0)
                    event(log, logging.INFO, "handover", "SIGTERM handover: %s", result, flow=node.name,
                          node=node.cfg.node_id, ok=bool(result.get("ok")), new_master=result.get("new_master"),
                          reason=result.get("reason"))
                except Exception:  # ZooKeeper unreachable: stop all the same
                    event(log, logging.ERROR, "handover", "SIGTERM handover failed; stopping", flow=node.name,
                          node=node.cfg.node_id, ok=False, exc_info=True)
            break
        if node.query is not None and not node.query.isActive:
            event(log, logging.ERROR, "stream_stopped", "the uplink stream stopped: %s", node.query.exception(),
                  flow=node.name, node=node.cfg.node_id)
            node.stop()
            return 1
        if node.batch_error is not None:  # a batch that ran ahead failed (FlowNode.on_batch)
            node.stop()
            return 1
        node._stop.wait(0.1)
    node.stop()
    return 0


def start_metrics(cfg: NodeConfig, nodes, server, flow: str, frames=None) -> MetricsServer:
    """Serve the metrics of ``nodes`` (a FlowNode, or a sharded node's shards) on
    ``cfg.metrics_listen``; StartRefused when that address cannot be bound."""
    try:
        metrics = serve_metrics(cfg.metrics_listen, nodes, server=server, frames=frames)
    except (OSError, ValueError) as exc:
        raise StartRefused(f"cannot serve metrics on {cfg.metrics_listen}: {exc}") from exc
    event(log, logging.INFO, "metrics", "%s serves Prometheus metrics on http://%s/metrics (unauthenticated)",
          cfg.node_id, metrics.address, flow=flow, node=cfg.node_id, address=metrics.address)
    return metrics
