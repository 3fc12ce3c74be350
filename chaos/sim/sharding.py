"""Sharded flows in the simulator: a shard's batches run where Spark runs them, on executors.

A sharded flow's peer (``cluster.shard_reading``) plans each micro-batch on its driver
(:class:`~twinflow.cluster.shard_task.ShardPlan`: the shard's role, epoch and
driver-side step count, taken with the shard's batch lock held) and runs it in
a task on an executor process with the real
:func:`~twinflow.cluster.shard_task.run_shard`; the driver then finishes it
with ``FlowMember.take_result``. Here each simulated peer has two executor
processes (:class:`Executor`), each with its own ``shard_task`` contexts, so
with its own kept flows (``ctx.flows``) and its own store on the peer's Redis
link. The seed decides, per batch:

- which executor runs the task (so a kept flow may be stale: another process
  ran the shard's last batch);
- whether an executor process is replaced first (its kept flows are gone);
- whether the task runs twice at once (Spark speculation, or an executor
  declared lost while still working): the second attempt runs on the other
  executor, either while the first one's COMMIT is in flight (if that
  COMMIT is held, see ``stepped_threads.SimWrites``) or right after it, and Spark keeps the
  result of whichever finished first (the seed's choice when both did);
- whether an attempt is declared lost: the driver runs the task again on the
  other executor at once, and the lost attempt runs later, at a step of its
  own (``Schedule.zombie``), its result thrown away, its writes not.

One shard is simulated (shards are independent flows: own keys, election,
epoch, fence), with every message published to its uplink. Each executor is a
``shard_task.TaskProcess`` of its own: ``run_shard`` keeps its contexts there,
opens the shard's store through it (a store on the peer's simulated Redis
link) and sends its COMMITs through its writers (``SimWrites``).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

from ...cluster import shard_task
from ...cluster.on_cluster import flow_keys
from ...runtime.flowgraph import FlowGraph
from ...runtime.store.flow_store import FlowStore
from .stepped_threads import SimWrites
from .redis_model import SimRedis

if TYPE_CHECKING:
    from .world import SimPeer

SHARD = 0
_pids = itertools.count(1000)


class Executor:
    """One executor process of a peer: its ``shard_task.TaskProcess`` (the kept flows) and its pid."""

    def __init__(self, sim: "SimPeer"):
        self.sim = sim
        self.pid = next(_pids)
        self.process = shard_task.TaskProcess(open_store=self._store, writes=lambda: SimWrites(sim))

    def _store(self, plan: shard_task.ShardPlan, graph: FlowGraph) -> FlowStore:
        world = self.sim.world
        client = SimRedis(world.redis_server, self.sim.redis_link, world.commits, world.replica, world.cached_at)
        return FlowStore(client, flow_keys(graph), plan.peer_id, id_ttl=graph.cluster.message.id_ttl,
                         sleep=world.wait, monotonic=world.clock.now)

    def run(self, plan: shard_task.ShardPlan, rows: list[tuple]) -> shard_task.ShardResult:
        r = shard_task.run_shard(plan, SHARD, rows, self.process)
        r.pid = self.pid
        return r


def executors(sim: "SimPeer") -> list[Executor]:
    if not sim.executors:
        sim.executors = [Executor(sim), Executor(sim)]
    return sim.executors


def plan_for(sim: "SimPeer") -> shard_task.ShardPlan:
    """What the driver ships with the batch (caller holds the shard's batch lock), as
    ``ShardReading.on_frame`` builds it."""
    member, world = sim.member, sim.world
    return shard_task.ShardPlan(
        flow_text=world.full_graph.text, flow_source=world.full_graph.source, redis_url="sim://redis",
        peer_id=member.cfg.peer_id, now=world.clock.now(), connect_deadline_s=1.0,
        roles={SHARD: member.executor_role()}, generations={SHARD: member.driver_steps})


def run_on_executors(sim: "SimPeer", batch_id: int, rows: list[tuple]) -> str:
    """One micro-batch of the shard, as a sharded peer runs it; says what happened (for the trace)."""
    from ...runtime.positions import WARMUP_POSITION
    member, world, rng = sim.member, sim.world, sim.world.rng
    real = [r for r in rows if r[0] != WARMUP_POSITION]
    member.batch_lock.acquire()
    try:
        if not real:  # the query's warm-up row: the driver marks every shard warm
            member.warmed()
            return ""
        plan = plan_for(sim)
        pool = executors(sim)
        notes = []
        if rng.random() < 0.1:
            i = rng.randrange(len(pool))
            pool[i] = Executor(sim)
            notes.append(f"executor {i} replaced (kept flows gone)")
        first = rng.randrange(len(pool))
        other = pool[1 - first]
        results: list[tuple[int, Any]] = []   # (order finished, result)
        d = world.dims
        if rng.random() < d.lost_attempt:
            # Declared lost: it runs later (Schedule.zombie), the driver runs the task again now.
            world.zombies.append((pool[first], plan, list(real)))
            notes.append(f"attempt on executor {first} declared lost (runs later)")
            results.append((0, other.run(plan, real)))
        elif rng.random() < d.speculation:
            # Two attempts at once: the second may run while the first's COMMIT is in flight.
            second: list = []
            hook = world.interleave_hook

            def alongside(s, when):
                if s is sim and not second:
                    second.append(other.run(plan, real))
                    return "the task's second attempt ran"
                return hook(s, when) if hook is not None else None

            world.interleave_hook = alongside
            saved = world.dims.interleave
            world.dims.interleave = max(saved, 0.5)
            try:
                r1 = pool[first].run(plan, real)
            finally:
                world.interleave_hook, world.dims.interleave = hook, saved
            if second:
                results = [(0, second[0]), (1, r1)]
                notes.append("two attempts at once (the second finished first)")
            else:
                r2 = other.run(plan, real)
                both = [(0, r1), (1, r2)]
                results = both if rng.random() < 0.5 else [(0, r2), (1, r1)]
                notes.append("two attempts, one after the other")
        else:
            results.append((0, pool[first].run(plan, real)))
        r = results[0][1]  # Spark keeps the first attempt to finish
        member.take_result(batch_id, r)
        return f" (role {r.role}{'; ' + '; '.join(notes) if notes else ''})"
    finally:
        member.batch_lock.release()


def run_zombie(world) -> str:
    """An attempt declared lost runs now; its result goes nowhere."""
    ex, plan, rows = world.zombies.pop(world.rng.randrange(len(world.zombies)))
    try:
        r = ex.run(plan, rows)
    except Exception as exc:
        return f"lost attempt of {plan.peer_id} failed ({type(exc).__name__}: {exc})"
    return f"lost attempt of {plan.peer_id} ran as {r.role} at epoch {r.epoch}: {r.delivered} delivered"
