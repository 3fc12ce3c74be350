"""A peer's and its members' real collaborators: Redis, ZooKeeper, the gRPC server and Spark, as
``twinflow run`` uses them (the contracts they fill are ``collaborators.PeerParts`` and ``collaborators.MemberParts``).

Under failure: every connection waits for its server up to the peer's
``connect_deadline_s`` and then raises ServiceUnavailable naming it. The JVM
is started before any gRPC thread exists. The flow's clock is Redis's time
(``flow_clock.py``): it connects at its first sample, once the first store
has, and runs on the local clock until then.
"""

from __future__ import annotations

import threading
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from .flow_shape import check_shape
from .start_position import check_restore
from ..runtime.flowgraph import FlowGraph
from ..runtime.store.flow_store import FlowStore
from .connect import connect_zookeeper
from .escalation import EscalationSender
from .escalation_servicer import EscalationServicer
from .flow_clock import RedisTime, RedisTimeClock
from .grpc_server import AdminServicer, IngestServicer, create_server
from .leadership import Leadership
from .write_pool import write_pool
from .connect import open_store
from .on_cluster import flow_keys
from .collaborators import UplinkReading
from .peer_config import PeerConfig
from .shard_reading import ShardReading
from .spark_reading import SparkReading

if TYPE_CHECKING:
    from .member import FlowMember
    from .peer import Peer


class RealParts:
    """Real servers and Spark, as ``twinflow run`` uses them: a peer's parts and its members' parts."""

    def __init__(self) -> None:
        self.spark = None
        self.flow_clock: RedisTimeClock | None = None
        self._redis_time: RedisTime | None = None

    # -- the peer's -----------------------------------------------------------
    def clock(self, graph: FlowGraph, config: PeerConfig) -> RedisTimeClock:
        """The flow's clock, one per peer: Redis's ``TIME`` on the primary that holds ``graph``'s
        uplink (the first member's), through a client made as its store's is."""
        if self.flow_clock is None:
            self._redis_time = RedisTime(config.redis_url, slot_key=flow_keys(graph).uplink)
            self.flow_clock = RedisTimeClock(self._redis_time, peer=config.peer_id)
        return self.flow_clock

    def zookeeper(self, peer: "Peer") -> Any:
        return connect_zookeeper(peer.cfg.zk_hosts, peer.cfg.connect_deadline_s, peer.spec.session_timeout)

    def engine(self, peer: "Peer") -> None:
        # The JVM is forked before any gRPC object exists: forking while gRPC's
        # threads run broke the JVM launch (seen once in ~13 starts).
        from ..runtime.spark.session import build_session

        self.spark = build_session(f"twinflow-{peer.name}-{peer.cfg.peer_id}", peer.cfg.spark_master,
                                   peer.cfg.spark_conf)

    def server(self, peer: "Peer") -> tuple[Any, int]:
        return create_server(
            peer.cfg.listen,
            escalation=EscalationServicer.for_flows({m.name: (m.on_claims, m.admit_escalation)
                                                     for m in peer.members}),
            ingest=IngestServicer(peer.name, peer.publish, failures=peer.failures),
            admin=AdminServicer(peer.status, peer.handover, failures=peer.failures, resume=peer.resume),
            security=peer.cfg.security,
            health=peer.health.servicer,
        )

    def reading(self, peer: "Peer", starts: list[dict]) -> UplinkReading:
        if peer.sharded:
            return ShardReading(self.spark, peer, starts)
        return SparkReading(self.spark, peer, peer.member, starts[0])

    def close(self) -> None:
        if self.spark is not None:
            self.spark.stop()
        if self._redis_time is not None:
            self._redis_time.close()

    # -- each member's ----------------------------------------------------------
    def store(self, member: "FlowMember") -> FlowStore:
        cfg = member.cfg
        store = open_store(cfg.redis_url, cfg.connect_deadline_s, member.keys, cfg.peer_id, member.spec)
        # Before anything reads the flow: a twinflow or a flow file that cannot carry on its state
        # in Redis is refused here (flow_shape.py). The simulator's flows never change, so its
        # parts skip it and its schedules stay as they were.
        check_shape(member.graph, store)
        check_restore(member, store)  # not on a restore under way, nor on a state directory older than one
        if member.clock is self.flow_clock and self.flow_clock.offset_s is None:
            # Redis answers now: the clock's first sample, before any time-out is set or fired,
            # so that none is on this machine's clock (a failure is retried at the first now()).
            self.flow_clock.sample()
        return store

    def sender(self, member: "FlowMember") -> EscalationSender:
        return EscalationSender(member.name, member.cfg.peer_id, lambda: member.epoch, member.escalation_targets,
                                batch_max=member.spec.escalation_batch, security=member.cfg.security)

    def leadership(self, member: "FlowMember") -> Leadership:
        return Leadership(member.zk, member.name, member.cfg.peer_id, member.address, member.on_promoted,
                          member.on_demoted, may_contend=member.may_contend, clock=member.clock.now,
                          on_event=member.events.note)

    def start_timers(self, member: "FlowMember") -> None:
        threading.Thread(target=member.run_timers, name="timers", daemon=True).start()

    def writes(self) -> Executor:
        return write_pool()

    def batches_ahead(self) -> Executor | None:
        return ThreadPoolExecutor(max_workers=1, thread_name_prefix="twinflow-batch")
