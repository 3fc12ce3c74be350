"""The collaborators a simulated FlowNode is built from (``cluster.node_parts.NodeParts``).

The node is the real :class:`twinflow.cluster.node.FlowNode`, started with
its real ``start()``; only what it talks to is simulated: its store is the
real :class:`FlowStore` on a :class:`SimRedis` (the real Lua scripts), its
leadership is :class:`SimLeadership` on the :class:`ZkModel`, its sender a
:class:`SimSender`, its uplink reader a :class:`SimStream` and its batch
thread an :class:`AheadBatch`, both stepped by the simulator. No thread is
started: the simulator calls the node's ``timer_round`` itself.
"""

from __future__ import annotations

from concurrent.futures import Executor, Future

import redis
from typing import TYPE_CHECKING, Any, Callable

from ...runtime.spark.source import WARMUP_POSITION
from ...runtime.store.flow_store import FlowStore, RedisUnavailable
from .escalation_model import SimSender
from .redis_model import SimRedis
from .zookeeper_model import SimLeadership, SimZkClient

if TYPE_CHECKING:
    from ...cluster.node import FlowNode
    from .world import SimNode


class _NoServer:
    def stop(self, grace: Any) -> None:
        pass


class SimStream:
    """The node's uplink reader: Spark's micro-batch loop, one batch per :meth:`step`.

    Its committed offset (the checkpoint) lives on the simulated node's disk,
    so it survives a restart with state and is gone after one without. A
    batch whose ``on_batch`` raises is not committed and is read again, as
    Spark does.
    """

    isActive = True

    def __init__(self, sim: "SimNode", node: "FlowNode", start: dict):
        self.sim, self.node = sim, node
        if sim.disk.get("offset") is None:
            sim.disk["offset"] = start["id"]
        self.warm = False
        self.held = False
        self.batch_id = 0

    def exception(self) -> None:
        return None

    def step(self) -> str:
        """Plan and run one batch; returns what happened (for the trace)."""
        node = self.node
        # As the real source does at every read: how far this reader's committed batches go
        # (read_id, read_n), which the master's trim must not cut past while this node is live.
        n = self.sim.disk.setdefault("n", 0)
        try:
            node.store.r.hset(node.keys.read(node.cfg.node_id),
                              mapping={"read_n": n, "read_id": self.sim.disk["offset"] or "0-0"})
        except redis.ConnectionError:
            return "read failed (Redis)"
        if not self.warm:
            rows = [(WARMUP_POSITION, None, None)]
        else:
            try:
                rows = node.store.read_uplink(self.sim.disk["offset"], "+", node.read_size,
                                              node.spec.message.max_bytes, max_bytes=node.spec.batch_bytes,
                                              deadline_s=0)
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
                node.on_batch(self.batch_id, rows)
                ran = ""
        except Exception as exc:
            self.sim.world.batch_failed(self.sim, exc)
            return f"batch of {len(rows)} not committed ({type(exc).__name__}: {exc})"
        if self.warm:
            self.sim.disk["offset"] = rows[-1][0]
            self.sim.disk["n"] = n + len(rows)
        self.warm = True
        return f"batch of {len(rows)} up to {rows[-1][0]}{ran}"


class _Pending(Future):
    """A call whose thread is the schedule's: it runs when given a turn (:meth:`run`) or
    when someone waits for it, whichever comes first."""

    def __init__(self, call: Callable[[], Any]):
        super().__init__()
        self._call: Callable[[], Any] | None = call

    def run(self) -> None:
        call, self._call = self._call, None
        if call is None:
            return
        try:
            self.set_result(call())
        except BaseException as exc:  # handed to whoever waits for it, as a thread's would be
            self.set_exception(exc)

    def result(self, timeout: float | None = None) -> Any:
        self.run()
        return super().result(timeout)


class _Inline(Executor):
    """The master's writer threads (``cluster.master_steps``): each write runs at once, in the
    caller's thread, so virtual time stays deterministic."""

    def submit(self, fn, /, *args, **kwargs) -> Future:
        done = _Pending(lambda: fn(*args, **kwargs))
        done.run()
        return done


class SimWrites(Executor):
    """The master's writer threads, with COMMITs that overlap the next step's build.

    As the seed says (``Dims.overlap``), a write runs at once (as :class:`_Inline`) or is held
    in flight: it reaches Redis only when the loop waits for it, that is after the loop built
    the next step on the flow, which is the overlap ``master_steps`` has with real threads.
    While it is held, before it reaches Redis or after (its reply on the way), the world may
    let something else happen (:meth:`World.interleave`): time passes, ZooKeeper is noticed,
    the other node promotes, a shard task's other attempt runs, Redis fails over, the writer is
    killed. The order is the seed's; no thread runs."""

    def __init__(self, sim: "SimNode"):
        self.sim = sim

    def submit(self, fn, /, *args, **kwargs) -> Future:
        world = self.sim.world
        if world.dims.overlap <= 0 or world.rng.random() >= world.dims.overlap:
            done = _Pending(lambda: fn(*args, **kwargs))
            done.run()
            return done
        sim = self.sim

        def held():
            world.interleave(sim, "before")
            out = fn(*args, **kwargs)
            world.interleave(sim, "after")
            return out

        return _Pending(held)


class AheadBatch(Executor):
    """A node's batch thread, stepped by the schedule (``cluster.node``, "Batches run
    ahead"): the batch runs at its own step, so the process can be killed after Spark
    committed it and before it ran, the window a real master has."""

    def __init__(self, sim: "SimNode | None" = None) -> None:
        self.pending: _Pending | None = None
        self.sim = sim
        self.running = False  # the batch is running now (a kill inside it lands ahead of the checkpoint)

    def submit(self, fn, /, *args, **kwargs) -> Future:
        def call():
            self.running = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.running = False

        self.pending = _Pending(call)
        return self.pending

    def run(self) -> str:
        """Run the batch waiting for its turn, if any; says what happened (for the trace)."""
        pending, self.pending = self.pending, None
        if pending is None or pending.done():
            return "nothing ahead"
        pending.run()
        exc = pending.exception()
        if exc is not None and self.sim is not None and isinstance(exc, Exception):
            self.sim.world.batch_failed(self.sim, exc)
        return "ran" if exc is None else f"failed ({type(exc).__name__}: {exc})"


class SimParts:
    """``connected`` says whether this incarnation is heard from by ZooKeeper."""

    def __init__(self, sim: "SimNode", connected: Callable[[], bool]):
        self.sim = sim
        self.world = sim.world
        self.connected = connected

    def store(self, node: "FlowNode") -> FlowStore:
        client = SimRedis(self.world.redis_server, self.sim.redis_link, self.world.commits, self.world.replica,
                          self.world.cached_at)
        return FlowStore(client, node.keys, node.cfg.node_id, id_ttl=node.spec.message.id_ttl,
                         sleep=self.world.wait, monotonic=self.world.clock.now)

    def zookeeper(self, node: "FlowNode") -> SimZkClient:
        return SimZkClient(self.world.zk)

    def prepare_stream(self, node: "FlowNode") -> None:
        pass

    def server(self, node: "FlowNode") -> tuple[Any, int]:
        return _NoServer(), 0

    def sender(self, node: "FlowNode") -> SimSender:
        return SimSender(self.world.net, node.cfg.node_id, lambda: node.epoch, node.escalation_targets)

    def leadership(self, node: "FlowNode") -> SimLeadership:
        return SimLeadership(self.world.zk, node.cfg.node_id, node.cfg.node_id, node.on_promoted, node.on_demoted,
                             node.may_contend, self.connected, self.world.say)

    def start_timers(self, node: "FlowNode") -> None:
        pass  # the simulator calls node.timer_round()

    def stream(self, node: "FlowNode", start: dict) -> SimStream:
        return SimStream(self.sim, node, start)

    def hold(self, stream: SimStream, held: bool) -> None:
        stream.held = held

    def pace(self, stream: SimStream, interval_ms: int) -> None:
        pass  # the schedule decides when a node reads; pacing is a speed matter, not a protocol one

    def stop_stream(self, stream: SimStream) -> None:
        stream.isActive = False

    def writes(self) -> Executor:
        return SimWrites(self.sim)  # the schedule, not a thread, decides what runs when

    def batches_ahead(self) -> "AheadBatch":
        self.sim.ahead = AheadBatch(self.sim)  # this incarnation's batch thread; a kill drops it unrun
        return self.sim.ahead

    def close(self) -> None:
        pass
