"""The collaborators a simulated peer and its member are built from (``cluster.collaborators``).

The peer and its member are the real :class:`twinflow.cluster.peer.Peer` and
:class:`twinflow.cluster.member.FlowMember`, started with the peer's real
``start()``; only what it talks to is simulated: its store is the
real :class:`FlowStore` on a :class:`SimRedis` (the real Lua scripts), its
ZooKeeper client a :class:`SimKazooClient` on the :class:`ZkModel`, its
leadership the real :class:`~twinflow.cluster.leadership.Leadership` on that
client, with threads that take turns (``turns.py``), its sender a
:class:`SimSender`, its uplink reader a :class:`SimStream` and its batch
thread an :class:`AheadBatch`, both stepped by the simulator. No thread runs
freely: the simulator calls the member's ``timer_round`` itself, and gives the
peer's ZooKeeper threads their turns.
"""

from __future__ import annotations

from concurrent.futures import Executor

import redis
from typing import TYPE_CHECKING, Any, Callable

from ...cluster.leadership import Leadership
from ...runtime.positions import SKIPPED_SIZE, WARMUP_POSITION, skipped_row
from ...runtime.store.flow_store import FlowStore
from ...runtime.store.scripts import counted_from
from ...runtime.store.store_errors import RedisUnavailable
from .escalation_model import SimSender
from .stepped_threads import AheadBatch, SimWrites
from .redis_model import SimRedis
from .kazoo_model import SimKazooClient
from .turns import PeerThreads

if TYPE_CHECKING:
    from ...cluster.member import FlowMember
    from ...cluster.peer import Peer
    from .world import SimPeer

# Processed entries a simulated read skips at most (a run sends about 40).
SKIP_PER_SIM_READ = 5


class _NoServer:
    def stop(self, grace: Any) -> None:
        pass


class SimStream:
    """The member's uplink reader: Spark's micro-batch loop, one batch per :meth:`step`.

    Its committed offset (the checkpoint) lives on the simulated peer's disk,
    so it survives a restart with state and is gone after one without. A
    batch whose ``on_batch`` raises is not committed and is read again, as
    Spark does.
    """

    isActive = True

    def __init__(self, sim: "SimPeer", member: "FlowMember", start: dict):
        self.sim, self.member = sim, member
        if sim.disk.get("offset") is None:
            sim.disk["offset"] = start["id"]
        self.warm = False
        self.held = False
        self.pace_fails = False  # the next pace raises, as a control file's write can (Schedule.timers)
        self.batch_id = 0
        self.counted: tuple[str, str, int] | None = None  # (offset, counted to, how many): see _read

    def exception(self) -> None:
        return None

    def hold(self, member: "FlowMember", held: bool) -> None:
        self.held = held

    def pace(self, member: "FlowMember", interval_ms: int, behind_ms: int = 0) -> None:
        # The schedule decides when a member reads; pacing is a speed matter, not a protocol one.
        # But setting it can fail, and whoever set it (a timer round, a promotion) must bear that.
        if self.pace_fails:
            self.pace_fails = False
            raise OSError("the reader's pace could not be written")

    def stop(self) -> None:
        self.isActive = False

    def step(self) -> str:
        """Plan and run one batch; returns what happened (for the trace)."""
        member = self.member
        # As the real source does at every read: how far this reader's committed batches go
        # (read_id, read_n), which the master's trim must not cut past while this peer is live.
        n = self.sim.disk.setdefault("n", 0)
        try:
            member.store.r.hset(member.keys.read(member.cfg.peer_id),
                                mapping={"read_n": n, "read_id": self.sim.disk["offset"] or "0-0"})
        except redis.ConnectionError:
            return "read failed (Redis)"
        skipped = 0
        if not self.warm:
            rows = [(WARMUP_POSITION, None, None)]
        else:
            try:
                rows, skipped = self._read(member)
            except RedisUnavailable:
                return "read failed (Redis)"
            if not rows:
                return "nothing to read"
        self.batch_id += 1
        try:
            if self.sim.world.dims.sharded:
                from .sharding import run_on_executors
                ran = run_on_executors(self.sim, self.batch_id, rows)
            else:
                member.on_batch(self.batch_id, rows)
                ran = ""
        except Exception as exc:
            self.sim.world.batch_failed(self.sim, exc)
            return f"batch of {len(rows)} not committed ({type(exc).__name__}: {exc})"
        if self.warm:
            self.sim.disk["offset"] = rows[-1][0]
            self.sim.disk["n"] = n + skipped + sum(size != SKIPPED_SIZE for _, _, size in rows)
        self.warm = True
        return f"batch of {len(rows)} up to {rows[-1][0]}{ran}" + (f" ({skipped} processed skipped)" if skipped else "")

    def _read(self, member: "FlowMember") -> tuple[list, int]:
        """The next batch's rows, and how many processed entries it skipped (the Spark
        source's ``skip_key`` in the runs whose ``skip_processed`` is drawn)."""
        store, after = member.store, self.sim.disk["offset"]
        bounds = (member.read_size, member.spec.message.max_bytes)
        if not self.sim.world.dims.skip_processed:
            return store.read_uplink(after, "+", *bounds, max_bytes=member.spec.batch_bytes, deadline_s=0), 0
        # A few processed entries at most per read (the source counts SKIP_PER_READ), and, as the
        # source does, processed entries alone are first counted without a batch, the next read
        # from the same offset going on from there: runs take the reads that stop short of the
        # mark and the counts carried across a Redis failover that takes the mark back.
        counted = counted_from(self.counted, after)
        rows, skipped, to = store.read_uplink_after_processed(after, *bounds, max_bytes=member.spec.batch_bytes,
                                                              deadline_s=0, skip_at_most=SKIP_PER_SIM_READ,
                                                              counted=counted)
        self.counted = None
        if skipped:
            self.sim.world.skipped_reads += 1
        if skipped and not rows and counted is None:  # not worth a batch yet (the source's "Skipping")
            self.counted = (after, to, skipped)
            return [], 0
        if skipped and not rows:  # as the source does: a row that says how far the batch handled
            rows = [skipped_row(to)]
        return rows, skipped


class SimParts:
    """A simulated peer's parts and its one member's; ``connected`` says whether this
    incarnation is heard from by ZooKeeper."""

    def __init__(self, sim: "SimPeer", connected: Callable[[], bool]):
        self.sim = sim
        self.world = sim.world
        self.connected = connected

    # -- the peer's -----------------------------------------------------------
    def zookeeper(self, peer: "Peer") -> SimKazooClient:
        """The incarnation's ZooKeeper session, with its threads (its event thread first)."""
        sim = self.sim
        sim.threads = PeerThreads(self.world.turns, f"{sim.peer_id}#{sim.gen}")
        sim.zk = SimKazooClient(self.world.zk, sim.peer_id, self.connected, sim.threads)
        return sim.zk

    def engine(self, peer: "Peer") -> None:
        pass

    def server(self, peer: "Peer") -> tuple[Any, int]:
        return _NoServer(), 0

    def reading(self, peer: "Peer", starts: list[dict]) -> SimStream:
        return SimStream(self.sim, peer.member, starts[0])

    def close(self) -> None:
        pass

    # -- its member's -----------------------------------------------------------
    def store(self, member: "FlowMember") -> FlowStore:
        world, sim = self.world, self.sim
        client = SimRedis(world.redis_server, sim.redis_link, world.commits, world.replica, world.cached_at,
                          after_started=(lambda: world.guarded.after_started(sim)) if world.guarded else None)
        return FlowStore(client, member.keys, member.cfg.peer_id, id_ttl=member.spec.message.id_ttl,
                         sleep=self.world.wait, monotonic=self.world.clock.now)

    def sender(self, member: "FlowMember") -> SimSender:
        return SimSender(self.world.net, member.cfg.peer_id, lambda: member.epoch, member.escalation_targets)

    def leadership(self, member: "FlowMember") -> Leadership:
        # The address is the peer ID: the simulated escalation links are named by peer.
        say, peer_id = self.world.say, member.cfg.peer_id

        def promoted(epoch: int) -> None:
            say(f"  {peer_id} won the election: epoch {epoch}")
            member.on_promoted(epoch)

        def demoted(reason: str) -> None:
            say(f"  {peer_id} demoted ({reason})")
            member.on_demoted(reason)

        return Leadership(member.zk, member.name, peer_id, peer_id, promoted, demoted,
                          may_contend=member.may_contend, threads=self.sim.threads, clock=member.clock.now,
                          on_event=member.events.note)

    def start_timers(self, member: "FlowMember") -> None:
        pass  # the simulator calls member.timer_round()

    def writes(self) -> Executor:
        return SimWrites(self.sim)  # the schedule, not a thread, decides what runs when

    def batches_ahead(self) -> "AheadBatch":
        self.sim.ahead = AheadBatch(self.sim)  # this incarnation's batch thread; a kill drops it unrun
        return self.sim.ahead
