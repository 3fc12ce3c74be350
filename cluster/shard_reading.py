"""A peer's reading of a sharded flow: one Spark query for every shard, one member per shard.

Each shard (``runtime/shards.py``) is a flow of its own on the cluster, so
the peer holds one :class:`~twinflow.cluster.member.FlowMember` per shard,
each with its own Redis keys, ZooKeeper election, epoch and fence,
escalation stream, bake, timers and status; a peer may be master of one
shard and worker of another. What they share is the peer's (its ZooKeeper
session and gRPC server) and this reading: one query whose source
(``shard_source``) reads each shard with new entries as one partition.

Each micro-batch is planned here (the role and epoch of every shard, with
every shard's batch lock held, always in shard order, so that no promotion
or timer step interleaves) and run where each partition is read, on the
executors (``shard_task``); the results come back here to be escalated and
baked (``FlowMember.take_result``). On ``--spark-master spark://...`` the
executors are the cluster's; a peer can then use more cores than its own
machine has.

Under failure: a task that fails is retried by Spark, then fails the query
and the peer exits (its batch uncommitted, read again on restart, each
committed step recognised as processed). A held shard (backpressure) stops
only that shard's reading.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from contextlib import ExitStack
from functools import partial
from typing import TYPE_CHECKING, Any

from .batch_intake import PeerStopping
from .shard_task import RESULT_SCHEMA, ShardPlan, run_partition

if TYPE_CHECKING:
    from .member import FlowMember
    from .peer import Peer


class ShardReading:
    """The one query that reads every shard of ``peer``'s flow (see the module doc)."""

    def __init__(self, spark: Any, peer: "Peer", starts: list[dict]):
        from ..runtime.spark.stream import PACK_ENTRIES, start_shard_stream

        self.peer = peer
        self.members = peer.members
        self.batches = 0
        self.timings = peer.frame_timings  # each micro-batch, all shards, for the metrics
        self._held: set[int] = set()
        self._hold_lock = threading.Lock()
        cfg = peer.cfg
        checkpoint = os.path.join(cfg.state_dir, peer.name, cfg.peer_id, "checkpoint")
        os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
        self.query = None
        self.query = start_shard_stream(
            spark,
            redis_url=cfg.redis_url,
            shards=[{"stream": m.keys.uplink, "status_key": m.keys.read(cfg.peer_id),
                     "start_id": start["id"], "start_n": start["n"]}
                    for m, start in zip(self.members, starts)],
            checkpoint_dir=checkpoint,
            on_frame=self.on_frame,
            max_batch_size=min(m.max_read_size for m in self.members),
            batch_bytes=peer.spec.batch_bytes,
            max_body_bytes=peer.spec.message.max_bytes,
            query_name=f"{peer.name}_{cfg.peer_id}".replace("-", "_").replace(".", "_"),
            # Each task takes its partition whole (run_partition): rows packed 1,000 entries to a
            # Spark row took one shard 2,172 -> 4,093 msg/s, 292.5 -> 241 µs of CPU per message
            # (bench/shards.py, docs/performance/throughput.md "Sharded uplinks on a Spark cluster").
            pack=PACK_ENTRIES,
        )

    @property
    def isActive(self) -> bool:  # noqa: N802  (Spark's name)
        return self.query.isActive

    def exception(self) -> Any:
        return self.query.exception()

    def on_frame(self, frame, batch_id: int) -> None:
        """Plan a micro-batch, run it on the executors, finish each shard's part here."""
        started = time.perf_counter()
        peer = self.peer
        with ExitStack() as held:
            for member in self.members:  # always in shard order: no two batches or promotions cross
                held.enter_context(member.batch_lock)
            if peer.stopping:
                raise PeerStopping(f"batch {batch_id} arrived while stopping; it is read again on restart")
            plan = ShardPlan(
                flow_text=peer.graph.text, flow_source=peer.graph.source, redis_url=peer.cfg.redis_url,
                peer_id=peer.cfg.peer_id, now=self.members[0].clock.now(),
                connect_deadline_s=peer.cfg.connect_deadline_s,
                roles={k: m.executor_role() for k, m in enumerate(self.members)},
                generations={k: m.driver_steps for k, m in enumerate(self.members)},
                packed=True,
            )
            table = frame.mapInArrow(partial(run_partition, plan), RESULT_SCHEMA).toArrow()

            for blob in table.column(0).to_pylist():
                result = pickle.loads(blob)
                if result.shard < 0:
                    for member in self.members:
                        member.warmed()
                    continue
                self.members[result.shard].take_result(batch_id, result)
            self.batches += 1
        self.timings.observe("shards", time.perf_counter() - started)

    def hold(self, member: "FlowMember", held: bool) -> None:
        from ..runtime.spark.stream import hold_shards

        with self._hold_lock:
            (self._held.add if held else self._held.discard)(self.members.index(member))
            if self.query is not None:
                hold_shards(self.query, set(self._held))

    def pace(self, member: "FlowMember", interval_ms: int, behind_ms: int = 0) -> None:
        return None  # one query for every shard: it reads each as soon as there is something

    def stop(self) -> None:
        from ..runtime.spark.stream import stop_stream

        stop_stream(self.query, 10.0)
