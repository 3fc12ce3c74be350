"""A peer: one ``twinflow run`` process, and the members it runs, one per flow or shard.

The peer holds what a process has once, whatever it runs: its config
(:class:`PeerConfig`), its ZooKeeper session, its uplink engine (Spark), its
gRPC server (escalations routed to the member of the flow they name,
publishes to the member whose uplink takes the body), its health service,
its metrics endpoint, its signals and the loop that runs it until it stops.
An unsharded flow is a peer with one member; a sharded flow a peer with one
member per shard (``shard_reading.py``). Each member
(:class:`~twinflow.cluster.member.FlowMember`) keeps its own role, epoch,
store, election, claims, bake and timers.

Under failure: a start that could break a promise is refused before the
peer reads (StartRefused, with what to do); a SIGTERM hands every master
role over first (and stops all the same when ZooKeeper cannot be reached);
an uplink reading that died, or a batch that ran ahead and failed, stops the
process with exit code 1 so that a supervisor restarts it and Spark reads
the uncommitted batch again.
"""

from __future__ import annotations

import gc
import logging
import threading
from typing import Any

from ..logs import event
from ..runtime.clock import Clock
from ..runtime.flowgraph import FlowGraph
from ..runtime.shards import ShardRouter, shard_graph
from ..tls_expiry import read_expiries
from .advertise import advertised, check_advertise
from .health import PeerHealth
from .member import FlowMember
from .console.on_peer import serve_console
from .console.server import ConsoleServer
from .metrics import MetricsServer
from .metrics import serve as serve_metrics
from .on_cluster import StartRefused, cluster_flow
from .collaborators import PeerParts, UplinkReading
from .peer_config import PeerConfig
from .flow_failures import FlowFailures
from .ingest_bodies import read_bodies
from .roles import MASTER
from .timings import BatchTimings

log = logging.getLogger("twinflow.peer")


# The status counts a sharded flow's peer sums over its members.
SUMMED = ("pending", "baked", "claimed", "rolled_back", "delivered", "failed", "unclaimed", "nohit", "uplink_lag",
          "backpressure", "holding")


class Peer:
    """One ``twinflow run`` process of a flow (see the module doc)."""

    def __init__(self, graph: FlowGraph, config: PeerConfig, *, parts: PeerParts, members: list[FlowMember]):
        self.graph, self.cfg, self.parts, self.members = graph, config, parts, members
        self.spec = cluster_flow(graph)
        self.name = graph.name
        # With shards, or on a Spark cluster, the flow's batches run on the executors (shard_reading).
        self.sharded = self.spec.shards > 1 or not config.spark_master.startswith("local")
        self.router = ShardRouter(self.spec.shards, self.spec.shard_key) if self.sharded else None
        self.frame_timings = BatchTimings(("shards",)) if self.sharded else None
        self.health = PeerHealth()  # one server, one health: it serves once a member streams
        self.zk = None
        self.server = None
        self.address = ""
        self.metrics: MetricsServer | None = None
        self.console: ConsoleServer | None = None
        self.reading: UplinkReading | None = None
        self._stop = threading.Event()
        self._term_requested = threading.Event()
        self._stopped = False
        self._heap_frozen = False

    @classmethod
    def for_flow(cls, graph: FlowGraph, config: PeerConfig, *, parts: Any, clock: Clock | None = None,
                 **member_options) -> "Peer":
        """A peer of ``graph`` with one member, or one per shard; ``parts`` fills both the
        peer's and the members' parts (``real_parts.RealParts``, or a test's or simulator's).
        The members share one clock: ``clock``, else the one ``parts`` gives for the first
        member's flow (Redis's time, ``flow_clock.py``), else the wall clock."""
        spec = cluster_flow(graph)
        graphs = [shard_graph(graph, k) for k in range(spec.shards)]
        clock = clock or parts.clock(graphs[0], config)
        members = [FlowMember(g, config, parts=parts, clock=clock, **member_options) for g in graphs]
        return cls(graph, config, parts=parts, members=members)

    @property
    def member(self) -> FlowMember:
        """The one member of an unsharded flow's peer."""
        if len(self.members) != 1:
            raise ValueError(f"{self.name} has {len(self.members)} members (one per shard)")
        return self.members[0]

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    # -- life cycle -------------------------------------------------------
    def start(self) -> None:
        """Connect (Redis, then ZooKeeper, each waiting up to the deadline), prepare every member
        (Redis checks, epoch, start position), start the engine, serve gRPC, join the elections, read."""
        cfg, parts = self.cfg, self.parts
        check_advertise(cfg.listen, cfg.advertise, redis_url=cfg.redis_url, zk_hosts=cfg.zk_hosts,
                        tls=cfg.security.tls)  # first: nothing is started for a start that cannot work
        if cfg.metrics_listen:  # first: a bad metrics address stops nothing half started
            self.metrics = start_metrics(cfg, lambda: self.members, lambda: self.server, self.name,
                                         frames=(self.name, self.frame_timings) if self.sharded else None)
        if cfg.console_listen:  # as early: a console that cannot be served refuses the start
            self.console = serve_console(self)
        for member in self.members:
            member.open_store()
        self.zk = parts.zookeeper(self)
        starts = [member.prepare(self) for member in self.members]
        parts.engine(self)
        self.server, port = parts.server(self)
        cfg.security.warn_if_insecure(cfg.listen, self._stop)
        self.address = advertised(cfg.listen, cfg.advertise, port)
        for member in self.members:
            member.serve(self)
        self.reading = parts.reading(self, starts)
        for member in self.members:
            member.read_with(self.reading)
        event(log, logging.INFO, "started", "%s reads %s (%d member%s; gRPC %s)", cfg.peer_id, self.name,
              len(self.members), "s" if len(self.members) > 1 else "", self.address, flow=self.name,
              peer=cfg.peer_id, members=len(self.members), address=self.address)

    def run_forever(self) -> int:
        """Start and run until stopped: 0 after a stop or a SIGTERM (see request_term), which
        hands every master role over first; 1 when the uplink reading or a batch failed."""
        self.start()
        while not self._stop.is_set():
            if self._term_requested.is_set():
                self.stop_gracefully()
                return 0
            if self.reading is not None and not self.reading.isActive:
                event(log, logging.ERROR, "stream_stopped", "the uplink stream stopped: %s",
                      self.reading.exception(), flow=self.name, peer=self.cfg.peer_id)
                self.stop()
                return 1
            if any(m.batch_error is not None for m in self.members):  # a batch that ran ahead failed
                self.stop()
                return 1
            if not self._heap_frozen and all(m.streaming for m in self.members):
                # What a peer loaded to start (modules, Spark's and gRPC's objects: about 100,000)
                # lives as long as the process: left out of the collector's full passes, which
                # walked all of it between batches (about 60 ms each on the master, measured).
                gc.freeze()
                self._heap_frozen = True
            self._stop.wait(0.1)
        self.stop()
        return 0

    def _hand_over_on_term(self) -> None:
        if not any(m.role == MASTER for m in self.members):
            return
        try:
            result = self.handover(5.0, by="SIGTERM")
            event(log, logging.INFO, "handover", "SIGTERM handover: %s", result, flow=self.name,
                  peer=self.cfg.peer_id, ok=bool(result.get("ok")), new_master=result.get("new_master"),
                  reason=result.get("reason"))
        except Exception:  # ZooKeeper unreachable: stop all the same
            event(log, logging.ERROR, "handover", "SIGTERM handover failed; stopping", flow=self.name,
                  peer=self.cfg.peer_id, ok=False, exc_info=True)

    def stop_gracefully(self) -> None:
        """What a SIGTERM asks for: hand every master role over (stopping all the same when that
        fails or ZooKeeper cannot be reached), then stop."""
        self._hand_over_on_term()
        self.stop()

    def request_term(self) -> None:
        """Ask for a graceful stop (safe to call from a signal handler)."""
        self._term_requested.set()

    def stop(self) -> None:
        """Stop every member (each closes its store first, so a batch waiting for Redis gives
        up uncommitted), then the reading, the server, the metrics, ZooKeeper and the engine."""
        if self._stopped:
            return
        self._stopped = True
        if self.sharded:  # each member logs its own "stopping" with its role and epoch
            event(log, logging.INFO, "stopping", "%s stopping %d shards of %s", self.cfg.peer_id,
                  len(self.members), self.name, flow=self.name, peer=self.cfg.peer_id, shards=len(self.members))
        self._stop.set()
        self.health.stopping()
        for member in self.members:
            member.stop_member()
        if self.reading is not None:
            try:
                self.reading.stop()
            except Exception:  # a batch refused on purpose (PeerStopping) fails the query
                log.info("uplink stream stopped with its last batch uncommitted (read again on restart)")
        for member in self.members:
            member.settle()
        if self.server is not None:
            self.server.stop(1.0)
        if self.metrics is not None:
            self.metrics.stop()
        if self.console is not None:
            self.console.stop()
        if self.zk is not None:
            self.zk.stop()
            self.zk.close()
        self.parts.close()

    # -- what the gRPC server serves ----------------------------------------
    def publish(self, bodies: list[bytes], deadline_s: float | None = None, publisher: str = "") -> list[str]:
        """Append each body to its member's uplink: entry IDs, or ``<shard flow>/<entry ID>`` for a
        sharded flow; with ``cluster.wait_replicas`` acknowledged once that many replicas have it.
        With ``publisher``, each message is recorded as that publisher's (its error notices name
        it). IngestRefused, nothing written, for a resubmit envelope (``ingest_bodies.py``)."""
        spec = self.spec
        message_ids = read_bodies(bodies, spec.message, publisher)
        if not self.sharded:
            return self.member.store.publish(bodies, deadline_s, replicas=spec.wait_replicas,
                                             replica_wait_ms=spec.replica_wait_ms, publisher=publisher,
                                             message_ids=[i for i in message_ids if i is not None])
        positions: list[str] = [""] * len(bodies)
        for k, items in self.router.split(bodies).items():
            member = self.members[k]
            ids = member.store.publish([b for _, b in items], deadline_s, replicas=spec.wait_replicas,
                                       replica_wait_ms=spec.replica_wait_ms, publisher=publisher,
                                       message_ids=[message_ids[i] for i, _ in items if message_ids[i] is not None])
            for (i, _), entry in zip(items, ids):
                positions[i] = f"{member.name}/{entry}"
        return positions

    def failures(self) -> FlowFailures:
        """The flow's audit and notices over its members' stores (what the Admin and Ingest
        services serve: ``failures_rpc.py``)."""
        spec = self.spec
        return FlowFailures(self.name, [m.store for m in self.members], max_bytes=spec.message.max_bytes,
                            replicas=spec.wait_replicas, replica_wait_ms=spec.replica_wait_ms)

    def status(self) -> dict:
        """The peer's status: its member's, or for a flow run on executors the counts summed over
        its members and ``role`` per shard."""
        rows = [m.status() for m in self.members]
        if not self.sharded:
            return rows[0]
        out = dict(rows[0])
        out["flow"] = self.name
        for key in SUMMED:
            out[key] = sum(int(r.get(key) or 0) for r in rows)
        rule_pending: dict[str, int] = {}
        for r in rows:
            for ruleset, count in (r.get("rule_pending") or {}).items():
                rule_pending[ruleset] = rule_pending.get(ruleset, 0) + count
        out["rule_pending"] = rule_pending
        out["uplink_lag_s"] = max(float(r.get("uplink_lag_s") or 0) for r in rows)  # the furthest behind
        out["streaming"] = int(all(r["streaming"] for r in rows))
        out["role"] = " ".join(f"s{k}:{r['role']}" for k, r in enumerate(rows))
        out["epoch"] = max(r["epoch"] for r in rows)
        return out

    def resume(self, by: str) -> list[dict]:
        """Ask the master to end the flow's suspensions (every shard's): the ones the request ends."""
        out = []
        for m in self.members:
            for node, s in m.store.request_resume(by, deadline_s=5.0).items():
                out.append({"flow": m.name, "node": node, **s})
        return out

    def handover(self, timeout_s: float, by: str = "admin") -> dict:
        """Hand every member this peer is master of over; ok when each one was. ``by``: who asked
        (``admin``: a Handover call; ``SIGTERM``), for each member's ``handover`` record."""
        if not self.sharded:
            return self.member.handover(timeout_s, by)
        masters = [m for m in self.members if m.role == MASTER]
        if not masters:
            return {"ok": False, "reason": "this peer is master of no shard"}
        replies = [(m.name, m.handover(timeout_s, by)) for m in masters]
        failed = [f"{name}: {r.get('reason')}" for name, r in replies if not r.get("ok")]
        return {"ok": not failed, "reason": "; ".join(failed),
                "new_master": ",".join(sorted({r.get("new_master", "") for _, r in replies} - {""})),
                "seconds": max(float(r.get("seconds") or 0) for _, r in replies)}


def start_metrics(cfg: PeerConfig, members, server, flow: str, frames=None) -> MetricsServer:
    """Serve the metrics of ``members`` on ``cfg.metrics_listen``; StartRefused when that
    address cannot be bound."""
    # The certificates as the server will load them in this start (twinflow/tls_expiry.py).
    certificates = read_expiries(cfg.security.tls, flow=flow, peer=cfg.peer_id)
    try:
        metrics = serve_metrics(cfg.metrics_listen, members, server=server, frames=frames,
                                certificates=certificates)
    except (OSError, ValueError) as exc:
        raise StartRefused(f"cannot serve metrics on {cfg.metrics_listen}: {exc}") from exc
    event(log, logging.INFO, "metrics", "%s serves Prometheus metrics on http://%s/metrics (unauthenticated)",
          cfg.peer_id, metrics.address, flow=flow, peer=cfg.peer_id, address=metrics.address)
    return metrics
